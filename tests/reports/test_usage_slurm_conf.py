"""The usage report and the engine's ``watchd_usage_*`` metrics read the cluster the engine config names
(``slurm.slurm_conf``), not only the one ``SLURM_CONF`` in the environment names: an engine started without
``SLURM_CONF`` exported, against the real cluster with slurmdbd and MariaDB."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
import structlog
import yaml

from tests.daemons import watchd_command
from tests.harness.slurm import SlurmCluster
from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.integrations.fake.scheduler import FakeScheduler

pytestmark = [pytest.mark.slurm]


@pytest.fixture(scope="module")
def finished_job(acct_cluster: SlurmCluster) -> str:
    """A job of account teamc that accounting has seen end."""
    c = acct_cluster
    job = c.submit("sleep 1", nodes=1, requeue=False, extra_args=["--account=teamc", "--gpus=1"])
    c.wait_job_state(job, ["COMPLETED"], timeout=60)
    deadline = time.monotonic() + 30
    while "COMPLETED" not in c.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", job).stdout:
        assert time.monotonic() < deadline, f"sacct never showed job {job} completed"
        time.sleep(0.3)
    return job


def _engine_config(slurm_conf: str) -> dict[str, object]:
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "mode": "dry-run",
        "slurm": {"enabled": False, "slurm_conf": slurm_conf},
        "reports": {"metrics": True},
    }


async def test_engine_metrics_read_the_configured_slurm_conf(
    acct_cluster: SlurmCluster, finished_job: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)  # as an engine whose unit exports none
    config = EngineConfig.model_validate(_engine_config(acct_cluster.env["SLURM_CONF"]))
    async with Engine(config, scheduler=FakeScheduler()) as engine:
        with structlog.testing.capture_logs() as logs:
            await engine.usage.refresh_metrics()
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{engine.port}/metrics") as r,
        ):
            metrics = await r.text()
    assert "watchd_usage_accounting_available 1.0" in metrics, [e for e in logs if "usage" in e["event"]]
    assert any(
        line.startswith("watchd_usage_gpu_seconds{") and 'account="teamc"' in line
        for line in metrics.splitlines()
    ), metrics
    assert not [e for e in logs if e["event"] == "usage_accounting_unavailable"]


async def test_engine_logs_accounting_it_cannot_read_once_without_blaming_slurmdbd(
    acct_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    missing = tmp_path / "nowhere" / "slurm.conf"
    config = EngineConfig.model_validate(_engine_config(str(missing)))
    async with Engine(config, scheduler=FakeScheduler()) as engine:
        with structlog.testing.capture_logs() as logs:
            await engine.usage.refresh_metrics()
            await engine.usage.refresh_metrics()
    [line] = [e for e in logs if e["event"] == "usage_accounting_unavailable"]  # once, not every refresh
    assert line["log_level"] == "warning" and str(missing) in line["why"], line
    assert "slurmdbd" not in line["why"], line


def test_report_usage_with_the_engine_config_reads_its_slurm_conf(
    acct_cluster: SlurmCluster, finished_job: str, tmp_path: Path
) -> None:
    config = tmp_path / "engine.yaml"
    config.write_text(yaml.safe_dump(_engine_config(acct_cluster.env["SLURM_CONF"])))
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    res = subprocess.run(
        [*watchd_command(), "report", "usage", "-c", str(config), "--since", "1h", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["accounting"] is True, (doc["accounting_note"], res.stderr)
    assert "teamc" in {row["key"]["account"] for row in doc["rows"]}
