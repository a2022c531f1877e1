"""What a round of active checks over a 200-node partition costs the engine.

1. Planning (pure, ``watchd.checks.plan.pick``): one pick over 200 candidates with their availability and
   state rows, the share cap at 10% (20 at once). Floor, same run: sorting the 200 names by last run and one
   dict lookup per node (the least any plan does).
2. A whole round in the engine process, CPU time (``time.process_time``): the service with the fake runner
   (jobs finish at once with the recorded 8 x H100 output), a state database on disk, every output parsed and
   judged, the peers compared, 200 events handed on: everything but the scheduler's own time. Floor, same run:
   parsing the recorded output 200 times (the judging no round can skip).
3. With ``--slurm``: the scheduler queries of one wave on the real test cluster (tests/harness/slurm.py):
   ``availability()`` over its 200 simulated nodes (scontrol show node, squeue, show reservation, sinfo), wall
   time; floor: one ``scontrol show node`` of the same 200 nodes.

Run: ``.venv/bin/python benchmarks/checks_plan.py [--slurm]``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from watchd.checks import plan  # noqa: E402
from watchd.checks.metrics import CheckMetrics  # noqa: E402
from watchd.checks.params import ChecksConfig  # noqa: E402
from watchd.checks.parsers import parse_nccl  # noqa: E402
from watchd.checks.runner import Availability, RunOutput  # noqa: E402
from watchd.checks.service import CheckService  # noqa: E402
from watchd.clock import SystemClock  # noqa: E402
from watchd.integrations.fake.checks import FakeCheckRunner, FakeNode  # noqa: E402
from watchd.model.events import Event  # noqa: E402
from watchd.store.checks import CheckNode  # noqa: E402
from watchd.store.database import Store  # noqa: E402

N = 200
OUTPUT = (ROOT / "tests" / "data" / "checks" / "nccl" / "h100-8gpu-single-node-pass.txt").read_text()
CONFIG = ChecksConfig.model_validate(
    {"enabled": True, "items": [{"name": "nccl", "type": "nccl", "partitions": ["gpu"], "max_share": 0.1}]}
)


def bench_plan() -> tuple[float, float]:
    names = [f"gpu-{i:03d}" for i in range(N)]
    cands = {n: ("gpu",) for n in names}
    avail = {
        n: Availability(i % 10 != 0, "" if i % 10 else "node is allocated", ("gpu",))
        for i, n in enumerate(names)
    }
    state = {n: CheckNode("nccl", n, "r", float(i), "passed", float(i), 0, 0.0) for i, n in enumerate(names)}
    limits = plan.caps(CONFIG.items[0], {"gpu": names})
    times, floors = [], []
    for _ in range(200):
        t0 = time.perf_counter()
        pick = plan.pick(cands, avail, state, running={}, done=set(), limits=limits, now=1e9)
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        order = sorted(cands, key=lambda n: (state[n].last_run or -1.0, n))
        _ = [avail[n].idle for n in order]
        floors.append(time.perf_counter() - t0)
    assert len(pick.start) == 20
    return statistics.median(times), statistics.median(floors)


async def bench_round(path: Path) -> tuple[float, float, int, int]:
    runner = FakeCheckRunner(
        [FakeNode(f"gpu-{i:03d}", ("gpu",)) for i in range(N)], lambda job: RunOutput("completed", OUTPUT, 0)
    )
    store = Store.open(path)
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    service = CheckService(CONFIG, runner, store, SystemClock(), emit, CheckMetrics(CollectorRegistry()))
    c0, w0 = time.process_time(), time.perf_counter()
    await service.run_round("nccl")
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    store.close()
    assert len(events) == N and max(runner.max_concurrent.values()) == 20
    return cpu, wall, runner.availability_calls, len(runner.submitted)


def floor_parse() -> float:
    c0 = time.process_time()
    for _ in range(N):
        parse_nccl(OUTPUT)
    return time.process_time() - c0


async def bench_slurm() -> tuple[float, float]:
    from tests.harness.slurm import SlurmCluster
    from watchd.integrations.slurm.checks import SlurmCheckRunner
    from watchd.integrations.slurm.scheduler import SlurmScheduler

    with SlurmCluster(real_nodes=1, simulated_nodes=N) as cluster:
        env = {"SLURM_CONF": str(cluster.conf_path)}
        sched = SlurmScheduler(env=env, persistent=False)
        runner = SlurmCheckRunner(sched, output_dir=Path(tempfile.gettempdir()))
        names = cluster.sim_node_names
        walls, floors = [], []
        for _ in range(10):
            t0 = time.perf_counter()
            avail = await runner.availability(names, 600)
            walls.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await sched.node_states(names)
            floors.append(time.perf_counter() - t0)
        assert len(avail) == N
        return statistics.median(walls), statistics.median(floors)


def main() -> int:
    pick_s, pick_floor = bench_plan()
    with tempfile.TemporaryDirectory() as d:
        cpu, wall, queries, jobs = asyncio.run(bench_round(Path(d) / "state.db"))
    parse_floor = floor_parse()
    print(f"measured on {sys.platform}, {time.strftime('%Y-%m-%d')}, python {sys.version.split()[0]}")
    print(
        f"plan: one pick over {N} nodes (20 started, 20 not idle): {pick_s * 1e6:.0f} us "
        f"(floor {pick_floor * 1e6:.0f} us, {pick_s / pick_floor:.1f}x)"
    )
    print(
        f"round: {N} nodes, {jobs} jobs, {queries} availability queries: engine CPU {cpu * 1e3:.0f} ms "
        f"({cpu / N * 1e3:.2f} ms per node), wall {wall * 1e3:.0f} ms; "
        f"floor (parsing the output {N} times) {parse_floor * 1e3:.0f} ms, {cpu / parse_floor:.1f}x"
    )
    if "--slurm" in sys.argv:
        slurm_s, slurm_floor = asyncio.run(bench_slurm())
        print(
            f"slurm: availability() of {N} nodes {slurm_s * 1e3:.0f} ms "
            f"(floor: scontrol show node of them, {slurm_floor * 1e3:.0f} ms, {slurm_s / slurm_floor:.1f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
