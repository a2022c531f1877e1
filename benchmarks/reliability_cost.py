"""What reliability accounting (docs/reliability.md) costs the engine.

1. The hot path: ``Reliability.observe`` for every event before evaluation, on 1,000,000 GPU summaries of
   12,500 nodes x 8 GPUs (100,000 GPUs). Floor, same run: ``Correlator.observe`` on the same events (the
   fleet state the detectors already keep per event).
2. The report (``Reliability.report``: read the durable record, group, estimate) for 12,500 nodes, one
   interval each, and 2,000 failures, from an on-disk state database; and one flush of every interval.
3. What the periodic work costs the event loop at 100,000 nodes (``--big-nodes``): the longest stall a
   task that only yields sees while the engine's ``flush()`` and ``cycle()`` run (paged, the report built
   in a thread), against the same work done blocking (``flush_now()`` and ``cycle_now()``, the form before
   paging) as the floor the ratio is taken to.
Run: ``.venv/bin/python benchmarks/reliability_cost.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import best_of, table  # noqa: E402
from watchd.clock import FakeClock  # noqa: E402
from watchd.detect.correlator import Correlator  # noqa: E402
from watchd.detect.params import DetectorsConfig  # noqa: E402
from watchd.jobs.topology import JobTopology  # noqa: E402
from watchd.model.events import Event  # noqa: E402
from watchd.reliability.settings import ReliabilityConfig  # noqa: E402
from watchd.reliability.subsystem import Reliability  # noqa: E402
from watchd.store.database import Store  # noqa: E402

NODES, GPUS, ROUNDS = 12_500, 8, 10


def events() -> list[Event]:
    out = []
    for r in range(ROUNDS):
        for n in range(NODES):
            for g in range(GPUS):
                attrs = {"gpu": g, "model": "NVIDIA H200", "util_mean": 99.0, "power_mean": 690.0}
                out.append(Event(f"{r}-{n}-{g}", f"gpu-{n}", "nvml", "gpu_summary", 1000.0 + 30 * r, attrs))
    return out


def loop_stalls(nodes: int, failures: int = 2_000) -> tuple[float, float, float, float]:
    """(longest stall, wall) of the paged periodic work and of the blocking form, at ``nodes`` nodes."""
    out: list[float] = []
    for paged in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            store = Store.open(Path(tmp) / "state.db")
            clock = FakeClock(start=1030.0)
            rel = Reliability(ReliabilityConfig(), store, clock, JobTopology(), lambda node: ["batch"])
            for t in (1000.0, 1030.0):
                for n in range(nodes):
                    attrs = {"gpu": 0, "model": "NVIDIA H200", "util_mean": 99.0}
                    rel.observe(Event(f"{n}-{t}", f"gpu-{n}", "nvml", "gpu_summary", t, attrs))
            rel.flush_now()
            for i in range(failures):
                store.reliability.add_failure(
                    1001.0 + i * 0.01, f"gpu-{i % nodes}", "r", f"e{i}", "xid 79", 0, "enforce"
                )
            for n in range(nodes):  # every open interval advanced: the next flush writes all of them
                rel.observe(Event(f"{n}-x", f"gpu-{n}", "nvml", "gpu_summary", 1060.0, {"gpu": 0}))

            async def periodic(rel: Reliability = rel, paged: bool = paged) -> tuple[float, float]:
                longest, done = 0.0, asyncio.Event()

                async def ticker() -> None:
                    nonlocal longest
                    last = time.perf_counter()
                    while not done.is_set():
                        await asyncio.sleep(0)
                        now = time.perf_counter()
                        longest, last = max(longest, now - last), now

                task = asyncio.create_task(ticker())
                await asyncio.sleep(0)
                t0 = time.perf_counter()
                if paged:
                    await rel.flush()
                    await rel.cycle()
                else:
                    rel.flush_now()
                    rel.cycle_now()
                wall = time.perf_counter() - t0
                done.set()
                await task
                return longest, wall

            out.extend(asyncio.run(periodic()))
            store.close()
    return out[0], out[1], out[2], out[3]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--big-nodes", type=int, default=100_000)
    args = parser.parse_args()
    evs = events()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "state.db")
        clock = FakeClock(start=1000.0 + 30 * ROUNDS)
        topology = JobTopology()
        rel = Reliability(ReliabilityConfig(), store, clock, topology, lambda node: ["batch"])

        def hot() -> None:
            for e in evs:
                rel.observe(e)

        def floor() -> None:
            corr = Correlator(DetectorsConfig(), JobTopology())
            for e in evs:
                corr.observe(e)

        t_rel, _ = best_of(hot, 3)
        t_floor, _ = best_of(floor, 3)
        t0 = time.perf_counter()
        rel.flush_now()
        t_flush = time.perf_counter() - t0
        for i in range(2000):
            store.reliability.add_failure(
                1100.0 + i * 0.01, f"gpu-{i % NODES}", "r", f"e{i}", "xid 79", 0, "enforce"
            )
        t_report, report = best_of(lambda: rel.report(now=clock.now(), since=0.0), 3)
        store.close()
    n = len(evs)
    print(f"reliability accounting: {NODES:,} nodes x {GPUS} GPUs, {n:,} summaries (best of 3)\n")
    print(
        table(
            ["what", "seconds", "us/event", "ratio to floor"],
            [
                ["Reliability.observe", f"{t_rel:.3f}", f"{1e6 * t_rel / n:.2f}", f"{t_rel / t_floor:.2f}"],
                ["floor: Correlator.observe", f"{t_floor:.3f}", f"{1e6 * t_floor / n:.2f}", "1.00"],
            ],
        )
    )
    print(f"\nflush of {NODES:,} intervals and nodes: {t_flush:.3f} s")
    print(f"report ({report.fleet.failures:,} failures, {len(report.nodes):,} nodes): {t_report:.3f} s")
    stall, wall, stall_floor, wall_floor = loop_stalls(args.big_nodes)
    print(f"\nperiodic flush + cycle, {args.big_nodes:,} nodes, 2,000 failures: the loop's longest stall\n")
    print(
        table(
            ["form", "longest stall s", "wall s", "stall ratio to floor"],
            [
                ["paged, report in a thread", f"{stall:.3f}", f"{wall:.3f}", f"{stall / stall_floor:.3f}"],
                ["floor: blocking", f"{stall_floor:.3f}", f"{wall_floor:.3f}", "1.000"],
            ],
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
