"""Validation's lifted drain and its new drain on the real Slurm test cluster are the Slurm port's verbs
(``resume``, ``apply_drain``): only a drain watchd made is lifted, and a failed validation drains the node
again with watchd's reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checks.test_slurm_checks import engine_config
from tests.harness.slurm import SlurmCluster
from watchd.checks.runner import RunnerError
from watchd.integrations.slurm.checks import VALIDATION_PREFIX, runner_from_config

pytestmark = pytest.mark.slurm


def reservations(cluster: SlurmCluster) -> str:
    return cluster.run("scontrol", "show", "reservation", "-o", check=False).stdout


async def test_an_admins_drain_is_never_lifted_for_a_validation(
    cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    runner = runner_from_config(engine_config(cluster, standins, tmp_path))
    cluster.drain("gpu-3", "admin: fan")
    try:
        with pytest.raises(RunnerError, match="cannot lift the drain of gpu-3: drained by someone else"):
            await runner.begin_validation("gpu-3", 30.0)
        node = cluster.node("gpu-3")
        assert "DRAIN" in node["State"] and node["Reason"].startswith("admin: fan"), node
        assert f"{VALIDATION_PREFIX}gpu-3" not in reservations(cluster)
    finally:
        cluster.reset_nodes(["gpu-3"])


async def test_a_failed_validation_drains_the_node_again_with_watchds_reason(
    cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    runner = runner_from_config(engine_config(cluster, standins, tmp_path))
    cluster.drain("gpu-3", "watchd: Xid 79")
    try:
        await runner.begin_validation("gpu-3", 30.0)
        assert "DRAIN" not in cluster.node("gpu-3")["State"]
        assert f"{VALIDATION_PREFIX}gpu-3" in reservations(cluster)
        assert await runner.end_validation("gpu-3", False, "nccl busbw 100 GB/s") == "drained"
        node = cluster.node("gpu-3")
        assert "DRAIN" in node["State"] and node["Reason"].startswith("watchd: nccl busbw 100 GB/s"), node
        assert f"{VALIDATION_PREFIX}gpu-3" not in reservations(cluster)
    finally:
        cluster.reset_nodes(["gpu-3"])
