"""What reliability accounting (issue 17, docs/reliability.md) costs the engine.

1. The hot path: ``Reliability.observe`` for every event before evaluation, on 1,000,000 GPU summaries of
   12,500 nodes x 8 GPUs (100,000 GPUs). Floor, same run: ``Correlator.observe`` on the same events (the
   fleet state the detectors already keep per event).
2. The report (``Reliability.report``: read the durable record, group, estimate) for 12,500 nodes, one
   interval each, and 2,000 failures, from an on-disk state database; and one flush of every interval.
Run: ``.venv/bin/python benchmarks/reliability_cost.py``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import best_of, table  # noqa: E402
from watchd.clock import FakeClock  # noqa: E402
from watchd.config import DetectorsConfig, ReliabilityConfig  # noqa: E402
from watchd.detect.correlator import Correlator  # noqa: E402
from watchd.engine.reliability import Reliability  # noqa: E402
from watchd.jobs.topology import JobTopology  # noqa: E402
from watchd.model.events import Event  # noqa: E402
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


def main() -> int:
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
