"""Two real engines on a real PostgreSQL with checks and hot spares, on the real Slurm test cluster: only the
leader changes the cluster. A validation asked of the follower is refused (503, naming the leader) and makes
no scontrol call (no reservation, the drain not lifted, the evidence kept); the follower never touches the
spares' reservation; the same validation asked of the leader runs and returns the node to service. Each
engine's ``scontrol`` is a wrapper that logs every call, so what each one asked of Slurm is counted, not
inferred."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.ha.pair import HaPair, request
from tests.harness.postgres import PostgresServer
from tests.harness.slurm import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.real]

NODE = "gpu-3"
EVIDENCE = "watchd: nccl busbw 312 GB/s < 80% of 450 GB/s"

WRAPPER = """#!/bin/sh
echo "$*" >> {log}
exec {real} "$@"
"""


def changes(log: Path) -> list[str]:
    """The calls that would change the cluster (the privilege probe names a node no cluster has)."""
    lines = log.read_text().splitlines() if log.exists() else []
    changing = ("update", "create", "delete", "requeue", "reboot")
    return [
        line
        for line in lines
        if line.split(" ", 1)[0] in changing and "watchd-privilege-probe-no-such-node" not in line
    ]


def test_only_the_leader_validates_or_keeps_spares(
    slurm_cluster: SlurmCluster, pg_server: PostgresServer, tmp_path: Path
) -> None:
    cluster = slurm_cluster
    cluster.reset_nodes(cluster.real_node_names)
    real = shutil.which("scontrol")
    assert real is not None
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o750)  # the engine refuses an output folder others can write
    tmp_path.chmod(0o755)
    checks = {
        "enabled": True,
        "runner": "slurm",
        "output_dir": str(out),
        "slurm": {"poll_interval_s": 0.2, "grace": "3s", "partition": "gpu"},
        "items": [{"name": "nhc", "type": "command", "command": ["/bin/true"], "time_limit": "20s"}],
    }
    pair = HaPair(
        pg_server,
        tmp_path,
        slurm_conf=str(cluster.conf_path),
        extra={"checks": checks, "spares": {"partitions": {"gpu": 1}}},
    )
    logs: dict[str, Path] = {}
    for name in ("a", "b"):
        logs[name] = tmp_path / f"scontrol-{name}.log"
        wrapper = tmp_path / f"scontrol-{name}"
        wrapper.write_text(WRAPPER.format(log=logs[name], real=real))
        wrapper.chmod(0o755)
        pair.configs[name]["slurm"]["scontrol"] = str(wrapper)
    try:
        pair.start("a")
        assert pair.leader()[0] == "a"
        pair.start("b")
        leader, follower = pair.engines["a"], pair.engines["b"]
        cluster.drain(NODE, EVIDENCE)
        # the follower: refused, nothing asked of Slurm
        status, body = request(follower.url, "POST", f"/api/v1/nodes/{NODE}/validate", b"", timeout=30)
        answer = json.loads(body)
        assert status == 503 and "not the leader" in answer["error"], answer  # before any scheduler call
        assert cluster.reason(NODE) == EVIDENCE
        assert "watchd-validate" not in cluster.run("scontrol", "show", "res", "-o", check=False).stdout
        assert changes(logs["b"]) == []  # no reservation, no drain lifted, no spare taken or released
        # the leader: validates, and the node is back in service after the check passed
        status, body = request(leader.url, "POST", f"/api/v1/nodes/{NODE}/validate", b"", timeout=90)
        answer = json.loads(body)
        assert status == 200 and answer["outcome"] == "resumed", answer
        assert cluster.reason(NODE) is None
        made = changes(logs["a"])
        assert any("ReservationName=watchd-validate-gpu-3" in c for c in made), made
        assert any("watchd_spares_gpu" in c for c in made), made  # the leader keeps the spare
        assert changes(logs["b"]) == []
    finally:
        for engine in pair.engines.values():
            engine.stop()
        cluster.run("scontrol", "delete", "ReservationName=watchd_spares_gpu", check=False)
        cluster.run("scontrol", "delete", f"ReservationName=watchd-validate-{NODE}", check=False)
        cluster.reset_nodes(cluster.real_node_names)
