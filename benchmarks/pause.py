"""The pause a GPU failure costs a job, measured on the real Slurm test cluster: from the Xid line
to the requeued job RUNNING again, on a hot spare and without one.

Each run: 4 slurmds (gpu-1..gpu-4); a 1-node victim job and exclusive filler jobs; a watchd agent (in this
process, shipping over real HTTP) whose kernel log gets an Xid 79 for the victim's node; a watchd engine
(in this process, enforce mode, the default rule pack) draining the node and requeueing its job through the
real ``scontrol``. The pause is cut into:

- detect:  Xid line written -> the drain action starts (agent parse + ship + ingest + rules), from the audit;
- drain:   the drain action (``scontrol update State=DRAIN``);
- requeue: the requeue action (``squeue`` + ``scontrol requeue``);
- slurm delay: requeue done -> the job's ``EligibleTime`` (Slurm holds a requeued batch job back for
  ``AuthInfo=cred_expire``, default 120 s: slurm.conf(5) of the installed 22.05, "This also controls how
  long a requeued job must wait before starting again");
- start:   eligible -> observed RUNNING (slurmctld's scheduling pass, ``sched_interval=1`` here, and launch).

Scenarios: ``spare`` (spares.partitions gpu=1; every other node busy: the job can only start on the spare
watchd releases when it requeues), ``free`` (no spare, one node idle). Without a spare and without an idle
node the job waits for some other job to end: no bound at all.

The engine runs the shipped defaults but for ``mode: enforce`` and the spare: the embedded rule pack, the
default breaker (10% of the 4-node partition rounds up to one drain), and the fleet polled every 60 s, which
comes while Slurm holds the requeued job back (the hold a 600 s poll used to hide: a poll that topped the
pool up then took the released spare back).

The floor, measured in the same run: the bare ``scontrol update State=DRAIN`` + ``scontrol requeue`` of an
idle test node and job. Run as root: ``python benchmarks/pause.py`` (about 2.5 minutes per run: Slurm's own
delay dominates).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness.slurm import SlurmCluster  # noqa: E402
from watchd.agent.runner import Agent  # noqa: E402
from watchd.agent.settings import EngineEndpoint, HeartbeatConfig  # noqa: E402
from watchd.config import AgentConfig, EngineConfig  # noqa: E402
from watchd.engine.runner import Engine  # noqa: E402
from watchd.fleetview.settings import SparesConfig  # noqa: E402
from watchd.gpu.settings import GpuSourceConfig  # noqa: E402
from watchd.http_settings import Listen  # noqa: E402
from watchd.integrations.slurm.fleet import parse_slurm_time  # noqa: E402
from watchd.integrations.slurm.scheduler import SlurmScheduler  # noqa: E402
from watchd.logs import configure_logging  # noqa: E402
from watchd.sources.base import FakeLogSource  # noqa: E402
from watchd.sources.settings import SourcesConfig  # noqa: E402

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python3, GPU has fallen off the bus."


def floor(cluster: SlurmCluster) -> float:
    """One bare drain + requeue through scontrol (no watchd): the Slurm calls watchd cannot avoid."""
    job = cluster.submit("sleep 600", nodes=1, extra_args=["--exclusive"])
    node = cluster.wait_job_running(job)["NodeList"]
    t = time.perf_counter()
    cluster.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=floor")
    cluster.run("scontrol", "requeue", job)
    took = time.perf_counter() - t
    cluster.cancel(job)
    cluster.reset_nodes([node])
    return took


async def one_run(cluster: SlurmCluster, scenario: str, run: int) -> dict[str, Any]:
    cluster.reset_nodes(cluster.real_node_names)
    spares = {"gpu": 1} if scenario == "spare" else {}
    config = EngineConfig(listen=Listen(port=0), mode="enforce", spares=SparesConfig(partitions=spares))
    jobs: list[str] = []
    async with AsyncExitStack() as stack:
        scheduler = SlurmScheduler(env=cluster.env)
        engine = await stack.enter_async_context(Engine(config, scheduler=scheduler))
        held = await engine.fleet.backends[0].spares() if spares else {}
        victim = cluster.submit("sleep 600", nodes=1, extra_args=["--exclusive"])
        jobs.append(victim)
        node = cluster.wait_job_running(victim)["NodeList"]
        # fillers: every other node busy, except one idle node in the "free" scenario
        others = [n for n in cluster.real_node_names if n != node and n not in held.get("gpu", [])]
        fill = len(others) - (1 if scenario == "free" else 0)
        if fill:
            filler = cluster.submit("sleep 600", nodes=fill, extra_args=["--exclusive"])
            jobs.append(filler)
            cluster.wait_job_running(filler)
        source = FakeLogSource("kmsg")
        agent_config = AgentConfig(
            node=node,
            engine=EngineEndpoint(url=f"http://127.0.0.1:{engine.port}"),
            listen=Listen(port=0),
            sources=SourcesConfig(gpu=GpuSourceConfig(backend="none")),
            heartbeat=HeartbeatConfig(enabled=False),
        )
        await stack.enter_async_context(Agent(agent_config, sources=[source]))
        await asyncio.sleep(0.5)
        t0 = time.time()
        source.inject_log(XID.format(pid=40_000 + run))
        running_at = None
        info: dict[str, str] = {}
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            info = await asyncio.to_thread(cluster.job, victim)
            if info.get("JobState") == "RUNNING" and int(info.get("Restarts", "0")) >= 1:
                running_at = time.time()
                break
            await asyncio.sleep(0.1)
        if running_at is None:
            raise RuntimeError(f"{scenario}: job {victim} not running again within 400 s: {info}")
        audit = {a["action"]: a for a in engine.recent_actions(100) if a["node"] == node}
        spare_rec = [a for a in engine.recent_actions(100) if a["action"] == "spare_release"]
    cluster.cancel(*jobs)
    cluster.run("scontrol", "delete", "ReservationName=watchd_spares_gpu", check=False)
    cluster.reset_nodes(cluster.real_node_names)
    drain, requeue = audit["drain"], audit["requeue"]
    drain_start = drain["time"] - drain["duration_s"]
    requeue_done = requeue["time"]
    eligible = parse_slurm_time(info.get("EligibleTime", "")) or requeue_done
    eligible = max(eligible, requeue_done)
    parts = {
        "detect": drain_start - t0,
        "drain": drain["duration_s"],
        "requeue": requeue_done - drain["time"],
        "slurm_delay": eligible - requeue_done,
        "start": running_at - eligible,
    }
    return {
        "scenario": scenario,
        "node": node,
        "restarted_on": info.get("NodeList"),
        "total_s": running_at - t0,
        "parts_s": parts,
        "watchd_s": parts["detect"] + parts["drain"] + parts["requeue"],
        "spare_released_after_requeue_s": (spare_rec[-1]["time"] - requeue_done) if spare_rec else None,
        "spare": held.get("gpu", [None])[0] if held else None,
        "on_the_spare": bool(held) and info.get("NodeList") in held.get("gpu", []),
    }


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1, help="runs per scenario (each ~2.5 min)")
    p.add_argument("--scenarios", default="spare,free")
    p.add_argument("--json", type=Path, help="write the results here too")
    args = p.parse_args()
    configure_logging("error", "json")
    results: list[dict[str, Any]] = []
    with SlurmCluster(real_nodes=4) as cluster:
        floors = [floor(cluster) for _ in range(5)]
        for scenario in args.scenarios.split(","):
            for run in range(args.runs):
                r = await one_run(cluster, scenario, run)
                results.append(r)
                parts = "  ".join(f"{k} {v * 1000:.0f} ms" for k, v in r["parts_s"].items())
                print(
                    f"{scenario:<6} run {run}: {r['total_s']:.1f} s Xid -> RUNNING on {r['restarted_on']} "
                    f"(was {r['node']}): {parts}",
                    flush=True,
                )
    fl = statistics.median(floors)
    print(f"\nfloor (bare scontrol drain + requeue, median of 5): {fl * 1000:.1f} ms")
    for scenario in args.scenarios.split(","):
        rs = [r for r in results if r["scenario"] == scenario]
        if scenario == "spare":
            on = sum(1 for r in rs if r["on_the_spare"])
            print(f"spare  restarted on the spare in {on} of {len(rs)} runs")
        total = statistics.median(r["total_s"] for r in rs)
        ours = statistics.median(r["watchd_s"] for r in rs)
        slurm = statistics.median(r["parts_s"]["slurm_delay"] + r["parts_s"]["start"] for r in rs)
        print(
            f"{scenario:<6} pause {total:.1f} s: watchd {ours * 1000:.0f} ms ({100 * ours / total:.2f} %, "
            f"{ours / fl:.1f}x the floor), Slurm's delay and start {slurm:.1f} s"
        )
    if args.json:
        args.json.write_text(json.dumps({"floor_s": floors, "runs": results}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
