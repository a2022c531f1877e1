"""``watchd engine --check`` tells whether Slurm lets the engine's user drain, resume, requeue anyone's job
and manage reservations, on the real test cluster with slurmdbd: root may; a plain user may not (and is told
how to fix it); nor may the same user with ``AdminLevel=Operator`` (Slurm 22.05 lets an operator requeue and
reserve, not drain); with ``AdminLevel=Administrator`` it may. The probe changes no node.

The plain user's answers come from the same probe with its ``scontrol`` run as that user (``runuser``): the
test's Python lives where only root may read it, and it is who runs ``scontrol`` that Slurm judges."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.daemons import watchd_command
from tests.harness.slurm import SlurmCluster
from watchd.integrations.slurm.privileges import Exec, probe

pytestmark = pytest.mark.slurm

USER = "daemon"  # a user of the test cluster's accounting (tests/conftest.py: acct_cluster)


@pytest.fixture
def config(acct_cluster: SlurmCluster) -> Iterator[Path]:
    """An enforcing engine's config, readable by every user (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="watchd-priv-"))
    d.chmod(0o755)
    path = d / "engine.yaml"
    path.write_text(yaml.safe_dump({"mode": "enforce", "slurm": {"slurm_conf": str(acct_cluster.conf_path)}}))
    path.chmod(0o644)
    yield path
    path.unlink()
    d.rmdir()


def check(config: Path) -> subprocess.CompletedProcess[str]:
    argv = [*watchd_command(), "engine", "--check", "--config", str(config)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def as_user(cluster: SlurmCluster, user: str) -> Exec:
    """Runs a command as ``user``, as the Slurm adapter runs its commands."""

    async def run(*argv: str, check: bool = True) -> tuple[int, str, str]:
        env = {**os.environ, **cluster.env}
        res = await asyncio.to_thread(
            subprocess.run, ["runuser", "-u", user, "--", *argv], capture_output=True, text=True, env=env
        )
        return res.returncode, res.stdout, res.stderr

    return run


def untouched(cluster: SlurmCluster) -> tuple[str, str]:
    sinfo = cluster.run("sinfo", "-R", "-h", "-o", "%N|%E").stdout
    reservations = cluster.run("scontrol", "show", "reservation", "-o", check=False).stdout
    return sinfo, reservations


def test_engine_check_tells_whether_slurm_lets_the_engine_drain(
    acct_cluster: SlurmCluster, config: Path
) -> None:
    before = untouched(acct_cluster)
    res = check(config)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "slurm: may act: Slurm lets root drain" in res.stdout
    refused = asyncio.run(probe("scontrol", as_user(acct_cluster, USER), USER))
    assert refused.allowed is False, refused
    assert refused.detail.startswith(f"Slurm refuses {USER} to drain") and "Invalid user id" in refused.detail
    assert f"sacctmgr modify user {USER} set adminlevel=admin" in refused.detail
    assert "SlurmUser (root)" in refused.detail  # who else may: named from scontrol show config
    try:
        acct_cluster.sacctmgr("modify", "user", USER, "set", "adminlevel=operator")
        time.sleep(1)  # slurmdbd pushes the change to slurmctld
        operator = asyncio.run(probe("scontrol", as_user(acct_cluster, USER), USER))
        assert operator.allowed is False, operator
        acct_cluster.sacctmgr("modify", "user", USER, "set", "adminlevel=admin")
        deadline = time.monotonic() + 30
        while (admin := asyncio.run(probe("scontrol", as_user(acct_cluster, USER), USER))).allowed is False:
            assert time.monotonic() < deadline, admin
            time.sleep(0.5)
        assert admin.allowed is True and admin.detail.startswith(f"Slurm lets {USER} drain"), admin
    finally:
        acct_cluster.sacctmgr("modify", "user", USER, "set", "adminlevel=none")
    assert untouched(acct_cluster) == before  # no node drained, no reservation made


@pytest.mark.parametrize(("mode", "privileged", "status"), [("enforce", False, 1), ("dry-run", False, 0)])
def test_a_refusal_fails_the_check_of_an_enforcing_engine(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    mode: str,
    privileged: bool,
    status: int,
) -> None:
    from watchd.cli import main
    from watchd.integrations import registry
    from watchd.integrations.fake.scheduler import FakeScheduler

    monkeypatch.setattr(registry, "build_scheduler", lambda config: FakeScheduler(privileged=privileged))
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"mode": mode, "slurm": {"enabled": False}}))
    assert main(["engine", "--check", "--config", str(path)]) == status
    assert "fake: REFUSED: the fake scheduler: refused" in capsys.readouterr().out


@pytest.mark.parametrize(("privileged", "value"), [(True, 1.0), (False, 0.0), (None, math.nan)])
async def test_the_engine_says_at_start_whether_it_may_act(privileged: bool | None, value: float) -> None:
    from watchd.config import EngineConfig
    from watchd.engine.runner import Engine
    from watchd.integrations.fake.scheduler import FakeScheduler

    fake = FakeScheduler(privileged=privileged)
    async with Engine(EngineConfig.model_validate({"listen": {"port": 0}}), scheduler=fake) as engine:
        sample = engine.metrics.registry.get_sample_value("watchd_scheduler_privileged")
    assert sample is not None and ("privileges", None) in fake.calls
    assert sample == value or (math.isnan(value) and math.isnan(sample))
