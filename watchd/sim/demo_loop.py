"""The second act of ``watchd demo``: the operator's loop, in enforce mode on a simulated Slurm.

A 4-node job hangs in a collective because one GPU fell off the bus; the detectors name the culprit, the
rules drain it and requeue the job, watchd releases the hot spare it kept idle, the requeued job starts on
it, and ``watchd drains`` shows what is out and why. The checkpoint advice is printed when the engine offers
it (:func:`checkpoint_advice`); without it the demo says where it goes.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from watchd import data
from watchd.actions.settings import SafetyConfig
from watchd.config import EngineConfig
from watchd.detect.params import DetectorsConfig
from watchd.drains_cli import render
from watchd.engine.runner import Engine
from watchd.fleetview.settings import DrainsConfig, SparesConfig
from watchd.http_settings import Listen
from watchd.integrations.fake.fleet import fleet_of
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.events import INGEST_PATH, batch_to_wire
from watchd.sim.jobs import JobRun, simulate

JOB = "4343"


def checkpoint_advice(engine: Engine, job: str) -> dict[str, Any] | None:
    """The engine's checkpoint advice for ``job`` when this build has it (reliability: the
    engine's ``reliability.advice(job)``, an object with ``to_dict()``), else None. The demo prints through
    this hook only; it imports nothing of the reliability part."""
    reliability = getattr(engine, "reliability", None)
    advise: Callable[[str], Any] | None = getattr(reliability, "advice", None)
    if advise is None:
        return None
    try:
        advice = advise(job)
        found = advice.to_dict() if hasattr(advice, "to_dict") else advice
    except Exception:  # an advice that cannot be computed must not end the demo
        return None
    return found if isinstance(found, dict) else None


def describe_advice(advice: dict[str, Any]) -> str:
    def minutes(key: str) -> str:
        value = advice.get(key)
        return f"{value / 60:.1f} min" if isinstance(value, int | float) else "?"

    return (
        f"checkpoint every {minutes('daly_s')} (Daly; Young {minutes('young_s')}) for MTBF_job "
        f"{minutes('job_mtbf_s')}, now every {minutes('current_s')}"
    )


async def run_loop_act(say: Callable[[str], None]) -> int:
    names = [f"gpu-{i:04d}" for i in range(5)]
    scheduler = FakeScheduler(partitions={"gpu": names})
    scheduler.add_nodes(names)
    fleet = fleet_of(scheduler)
    run = JobRun(
        "hang_lost",
        nodes=4,
        duration_s=150.0,
        fault_at=100.0,
        culprit=(2, 3),
        start=time.time() - 150.0,
        job=f"slurm:{JOB}",
    )
    scheduler.add_job(JOB, run.nodes_list)
    fleet.job_sizes[JOB] = 4
    pack = Path(data.__file__).parent / "rules"  # the hang rules alone: the Xid rules would act first
    config = EngineConfig(
        listen=Listen(host="127.0.0.1", port=0),
        mode="enforce",
        rules=[pack / "findings.yaml", pack / "fleet.yaml"],
        default_rules=False,
        safety=SafetyConfig(max_fraction=0.5),
        detectors=DetectorsConfig(interval_s=0.5),
        drains=DrainsConfig(poll_s=600),
        spares=SparesConfig(partitions={"gpu": 1}),
    )
    say("the loop, in enforce mode on a simulated Slurm partition gpu (5 nodes, 1 kept as a hot spare):")
    async with Engine(config, scheduler=scheduler) as engine, aiohttp.ClientSession() as http:
        say(f"  spare     {', '.join(fleet.reserved.get('gpu', []))} held idle (watchd's reservation)")
        say(f"  job       {JOB} runs on {', '.join(run.nodes_list)}")
        say(f"            GPU 3 of {run.culprit_node} falls off the bus; the others spin in the all-reduce")
        # one batch in time order, as the agents' streams interleave: no node's history arrives ahead
        events = sorted(simulate(run), key=lambda e: e.time)
        body = json.dumps(batch_to_wire(run.culprit_node, events))
        async with http.post(f"http://127.0.0.1:{engine.port}{INGEST_PATH}", data=body) as resp:
            if resp.status != 200:
                say(f"  ingest refused: {resp.status} {await resp.text()}")
                return 1
        deadline = time.monotonic() + 15
        # slurmctld's scheduling passes, on the simulated scheduler
        while not fleet.schedule() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        findings = engine.status()["findings"]
        hangs = [f for f in findings if f["kind"] == "nccl_hang"]
        hang = next((f for f in hangs if f["attrs"].get("hardware")), hangs[0] if hangs else None)
        if hang is None:
            say("  no hang found within 15 s: something is wrong")
            return 1
        attrs = hang["attrs"]
        say(
            f"  finding   nccl_hang of job {attrs.get('job')}: culprit {attrs.get('culprit_node')} GPU "
            f"{attrs.get('culprit_gpu')} ({attrs.get('evidence')}), the other ranks spin"
        )
        for a in engine.recent_actions(100):
            if a["action"] in ("drain", "requeue", "spare_release", "alert"):
                say(
                    f"  decision  {a['action']:<13} {a['node']:<9} {a['rule']:<22} -> {a['outcome']}: "
                    f"{a['detail']}"
                )
        job = scheduler.jobs[JOB]
        if job.state != "running":
            say(f"  job {JOB} did not start again: something is wrong")
            return 1
        spare_used = set(job.nodes) - set(run.nodes_list)
        say(
            f"  restart   job {JOB} running again on {', '.join(job.nodes)}"
            + (f": on the spare {', '.join(sorted(spare_used))}" if spare_used else "")
        )
        advice = checkpoint_advice(engine, f"slurm:{JOB}")
        if advice is not None:
            say(f"  advice    {describe_advice(advice)}")
        else:
            say("  advice    checkpoint interval (Young/Daly, partition MTBF): none for this job yet")
        await engine.fleet.poll()
        out = io.StringIO()
        render(engine.fleet.document(), out)
        say("")
        say("$ watchd drains")
        for line in out.getvalue().rstrip().splitlines():
            say(f"  {line}")
    return 0
