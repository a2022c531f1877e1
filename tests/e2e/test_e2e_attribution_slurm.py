"""On the real Slurm test cluster, with an agent on each node of a 2-node job (the normal deployment): the
job's one output file is read by the agent on its batch host only, and the NCCL NET/IB completion errors its
task on gpu-2 prints are credited to gpu-2 — the host NCCL names — not to the node whose agent read them. The
hang that follows drains gpu-2 with the NIC evidence and requeues the job; gpu-1 stays in service.

The job runs one task per node with ``srun``; the task on gpu-2 prints real NCCL lines (tests/data/trainlog,
with the host NCCL prints, ``gethostname()``, being the node's name here: the test cluster's slurmds share one
machine). The GPU windows of the hang (every rank spinning, no Xid: NVML alone names nobody) come from the
simulator, as no GPU runs here."""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from pathlib import Path

import aiohttp
import pytest

from tests.agent.test_agent import agent_config
from tests.harness.slurm import SlurmCluster
from tests.support import eventually
from watchd.agent.runner import Agent
from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.http_settings import Listen
from watchd.model.events import INGEST_PATH, batch_to_wire
from watchd.model.trainlog import KINDS as TRAINLOG_KINDS
from watchd.sim.jobs import JobRun, simulate
from watchd.sources.settings import KmsgConfig, SourcesConfig, TrainingLogsConfig
from watchd.sources.slurm_jobs import SlurmJobOutputs

pytestmark = pytest.mark.slurm

DATA = Path(__file__).resolve().parent.parent / "data" / "trainlog" / "nccl_warn.log"


def nccl_line(status: str) -> str:
    """A real NET/IB completion error from nccl_warn.log, printed with this task's host and pid."""
    line = next(x for x in DATA.read_text().splitlines() if "NET/IB" in x and f"status={status} " in x)
    return line.split(" ", 1)[1]  # without the recorded host:pid:tid


async def test_nic_errors_printed_on_gpu_2_drain_gpu_2_with_an_agent_on_every_node(
    slurm_cluster: SlurmCluster,
) -> None:
    cluster = slurm_cluster
    cluster.reset_nodes(["gpu-1", "gpu-2"])
    assert cluster.dir is not None
    go = cluster.dir / "jobs" / f"go-attribution-{time.time_ns()}"
    retry = nccl_line("12")  # IBV_WC_RETRY_EXC_ERR: the broken link's own end
    flush = nccl_line("5")  # IBV_WC_WR_FLUSH_ERR: what the healthy peer sees after it
    task = (
        f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.2; done; "
        'if [ "$SLURMD_NODENAME" = gpu-2 ]; then line='
        + shlex.quote(retry)
        + "; n=3; else line="
        + shlex.quote(flush)
        + "; n=1; fi; for i in $(seq $n); do "
        + 'printf "%s:%s:%s [1] %s\\n" "$SLURMD_NODENAME" $$ $$ "$line"; done; '
        "sleep 600"
    )
    script = f"srun --nodes=2 --ntasks-per-node=1 bash -c {shlex.quote(task)}"
    job = cluster.submit(script, nodes=2, requeue=True, extra_args=["-w", "gpu-[1-2]"])
    try:
        assert cluster.wait_job_running(job)["NodeList"] == "gpu-[1-2]"
        label = f"slurm:{job}"
        # squeue names the batch host: only gpu-1 reads the job's output
        assert [o.job for o in SlurmJobOutputs("gpu-1", env=cluster.env).running()] == [label]
        assert SlurmJobOutputs("gpu-2", env=cluster.env).running() == []
        config = EngineConfig(
            listen=Listen(port=0),
            mode="enforce",
            slurm={"slurm_conf": cluster.conf_path},
            safety={"max_fraction": 0.5},
        )
        async with Engine(config) as engine:
            agents = []
            for node in ("gpu-1", "gpu-2"):
                sources = SourcesConfig(
                    kmsg=KmsgConfig(enabled=False),
                    training=TrainingLogsConfig(
                        slurm_jobs=True, slurm_node=node, slurm_conf=cluster.conf_path
                    ),
                )
                agents.append(
                    Agent(agent_config(engine.port).model_copy(update={"node": node, "sources": sources}))
                )
            async with agents[0] as batch_host, agents[1] as other:
                [reader] = [s for s in batch_host.sources if s.name == "slurm-jobs"]
                await eventually(lambda: len(reader.follow.followed) == 1, what="gpu-1 follows the output")  # type: ignore[attr-defined]
                [idle] = [s for s in other.sources if s.name == "slurm-jobs"]
                assert idle.follow.followed == {}  # type: ignore[attr-defined]
                go.write_text("")
                training = engine.correlator.fleet.training
                nodes = ("gpu-1", "gpu-2")
                await eventually(
                    lambda: sum(map(len, training.nic_errors(label, nodes, 0, 1e12).values())) == 4,
                    timeout=30,
                    what="the NIC errors at the engine",
                )
                by_node = training.nic_errors(label, nodes, 0, 1e12)
                assert {n: [e.status for e in errs] for n, errs in by_node.items()} == {
                    "gpu-2": [12, 12, 12],
                    "gpu-1": [5],
                }
                assert {e.origin.reporter for errs in by_node.values() for e in errs} == {"gpu-1"}

                # the hang: 150 s of windows ending now, every rank spinning since 50 s ago
                run = JobRun(
                    "hang_nic",
                    nodes=2,
                    duration_s=150.0,
                    fault_at=100.0,
                    culprit=(1, 1),
                    start=time.time() - 150.0,
                    job=label,
                )
                names = {run.node_name(i): f"gpu-{i + 1}" for i in range(2)}
                kinds = {k.KIND for k in TRAINLOG_KINDS}
                events = [
                    dataclasses.replace(e, node=names[e.node]) for e in simulate(run) if e.kind not in kinds
                ]
                async with aiohttp.ClientSession() as http:
                    for node in nodes:
                        body = json.dumps(batch_to_wire(node, [e for e in events if e.node == node]))
                        async with http.post(f"http://127.0.0.1:{engine.port}{INGEST_PATH}", data=body) as r:
                            assert r.status == 200, await r.text()

                await eventually(
                    lambda: "DRAIN" in cluster.node_state("gpu-2"), timeout=40, what="gpu-2 drained"
                )
                reason = cluster.reason("gpu-2") or ""
                assert reason.startswith("watchd: hang "), reason
                assert f"nic_errors: NCCL hang of job {label}" in reason, reason
                assert "status 12" in reason and "status 5" not in reason, reason
                assert "DRAIN" not in cluster.node_state("gpu-1")
                await eventually(
                    lambda: int(cluster.job(job).get("Restarts", "0")) >= 1, timeout=30, what="job requeued"
                )
                [finding] = [f for f in engine.status()["findings"] if f["kind"] == "nccl_hang"]
                assert (finding["attrs"]["culprit_node"], finding["attrs"]["evidence"]) == (
                    "gpu-2",
                    "nic_errors",
                )
    finally:
        cluster.cancel(job)
        cluster.reset_nodes(["gpu-1", "gpu-2"])
