"""End to end on the real Slurm test cluster: a 2-node job hangs because one rank's GPU fell off the bus.
The engine learns the job's nodes from squeue, its detectors name the culprit from the simulated agents'
windows and hardware events, and the findings rules drain exactly that node, requeue the job and page a
real Alertmanager."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import aiohttp
import pytest

from tests.harness.alertmanager import AlertmanagerProcess
from tests.harness.slurm import SlurmCluster
from tests.support import eventually
from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.http_settings import Listen
from watchd.integrations.alertmanager.settings import AlertmanagerConfig
from watchd.model.events import INGEST_PATH, batch_to_wire
from watchd.sim.jobs import JobRun, simulate

pytestmark = pytest.mark.slurm
FINDINGS_RULES = Path(__file__).resolve().parent.parent.parent / "rules" / "findings.yaml"


async def test_hang_with_a_lost_gpu_drains_the_culprit_requeues_and_pages(
    slurm_cluster: SlurmCluster, alertmanager: AlertmanagerProcess, tmp_path: Path
) -> None:
    cluster = slurm_cluster
    cluster.reset_nodes(["gpu-1", "gpu-2"])
    job = cluster.submit("sleep 600", nodes=2, requeue=True, extra_args=["-w", "gpu-[1-2]"])
    assert cluster.wait_job_running(job)["NodeList"] == "gpu-[1-2]"
    try:
        # 150 s of the job ending now; gpu-1's GPU 3 falls off the bus 50 s ago, every other rank spins.
        run = JobRun(
            "hang_lost",
            nodes=2,
            duration_s=150.0,
            fault_at=100.0,
            culprit=(0, 3),
            start=time.time() - 150.0,
            job=f"slurm:{job}",
        )
        names = {run.node_name(i): f"gpu-{i + 1}" for i in range(2)}
        events = [dataclasses.replace(e, node=names[e.node]) for e in simulate(run)]
        config = EngineConfig(
            listen=Listen(port=0),
            rules=[FINDINGS_RULES],
            default_rules=False,
            mode="enforce",
            slurm={"slurm_conf": cluster.conf_path},
            safety={"max_fraction": 0.5},
            alertmanager=AlertmanagerConfig(urls=[alertmanager.url], resend_interval_s=1),
            detectors={"interval_s": 1.0},
        )
        async with Engine(config) as engine, aiohttp.ClientSession() as http:
            for node in ("gpu-1", "gpu-2"):
                mine = [e for e in events if e.node == node]
                body = json.dumps(batch_to_wire(node, mine))
                async with http.post(f"http://127.0.0.1:{engine.port}{INGEST_PATH}", data=body) as r:
                    assert r.status == 200, await r.text()

            await eventually(lambda: "DRAIN" in cluster.node_state("gpu-1"), timeout=30, what="gpu-1 drained")
            reason = cluster.reason("gpu-1") or ""
            assert reason.startswith("watchd: hang "), reason  # what sinfo -R shows: the kind and the GPU
            assert f"gpu_lost: NCCL hang of job slurm:{job}" in reason, reason
            assert "DRAIN" not in cluster.node_state("gpu-2")
            await eventually(
                lambda: int(cluster.job(job).get("Restarts", "0")) >= 1, timeout=30, what="job requeued"
            )
            await eventually(
                lambda: alertmanager.alert("hang-hardware-culprit") is not None, timeout=30, what="alert"
            )
            alert = alertmanager.alert("hang-hardware-culprit")
            assert alert is not None and alert["labels"]["node"] == "gpu-1"
            assert "gpu-1 is the culprit (gpu_lost)" in alert["annotations"]["summary"]
            findings = engine.status()["findings"]
            assert [f["kind"] for f in findings] == ["nccl_hang"]
            assert (
                findings[0]["attrs"]["culprit_node"] == "gpu-1" and findings[0]["attrs"]["culprit_gpu"] == 3
            )
    finally:
        cluster.cancel(job)
        cluster.reset_nodes(["gpu-1", "gpu-2"])
