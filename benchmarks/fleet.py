"""A fleet against one engine: `watchd sim`'s simulator (in this process) and a real `watchd engine` process.

1,000 nodes x 8 GPUs sampled every 5 s (the default interval; 5 s summary windows) by the fleet simulator,
shipping over real HTTP to a `watchd engine` process in dry-run mode with the shipped rule pack (rules/) and
its state in a temp dir. After a warm-up, for --duration seconds (default 60) it measures:

- engine CPU (cores used: utime + stime from /proc/<pid>/stat over the wall time) and RSS (VmRSS, VmHWM);
- events/s the engine received (watchd_events_received from its /metrics);
- ingest lag: the age of events at ingest (watchd_event_age_seconds): mean, and a p95 estimated from the
  histogram buckets (linear within a bucket). A gpu_summary event is stamped with the start of its window
  and sent when the window closes, at the GPU's first sample of the next window: with a 5 s window and a
  5 s interval, it is 5-10 s old before it leaves the node (7.5 s on average, the nodes being spread over
  the interval). "Transport" below is the mean age less that expected part;
- the simulator's own CPU (this process, all threads) and whether its sampling kept to schedule;
- dropped events (queue full, rejected, undelivered at the end): must be 0.

Run: `.venv/bin/python benchmarks/fleet.py` (about 90 s). No Slurm needed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.daemons import Daemon, engine_config, free_port  # noqa: E402
from watchd.logs import configure_logging  # noqa: E402
from watchd.sim.fleet import Fleet, parse_fleet  # noqa: E402
from watchd.sim.simulator import Simulator  # noqa: E402

TOKEN = "fleet-bench-token"
_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15 of stat)


def proc_mem_mib(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Scrape:
    """One /metrics snapshot: events received, the event-age histogram, ingest refusals."""

    def __init__(self, url: str) -> None:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            text = r.read().decode()
        self.received = 0.0
        self.rejected = 0.0
        self.age_buckets: dict[float, float] = {}
        self.age_sum = 0.0
        self.age_count = 0.0
        self.queue_depth = 0.0
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "watchd_events_received_total":
                    self.received += s.value
                elif s.name == "watchd_ingest_rejected_total":
                    self.rejected += s.value
                elif s.name == "watchd_event_age_seconds_bucket":
                    self.age_buckets[float(s.labels["le"])] = s.value
                elif s.name == "watchd_event_age_seconds_sum":
                    self.age_sum = s.value
                elif s.name == "watchd_event_age_seconds_count":
                    self.age_count = s.value
                elif s.name == "watchd_engine_queue_depth":
                    self.queue_depth = s.value


def quantile(buckets: dict[float, float], q: float) -> float:
    """histogram_quantile over cumulative buckets (le -> count), linear within the bucket."""
    edges = sorted(buckets)
    total = buckets[edges[-1]]
    if total <= 0:
        return float("nan")
    rank = q * total
    prev_edge, prev_count = 0.0, 0.0
    for edge in edges:
        count = buckets[edge]
        if count >= rank:
            if edge == float("inf"):
                return prev_edge  # beyond the last finite bucket: its lower bound
            inside = count - prev_count
            return prev_edge + (edge - prev_edge) * ((rank - prev_count) / inside if inside else 0.0)
        prev_edge, prev_count = edge, count
    return prev_edge


def fleet_of(nodes: int, gpus: int, interval: float, window: float) -> Fleet:
    return parse_fleet(
        {
            "seed": 1,
            "nodes": {"count": nodes, "name": "sim-{i}", "start": 1},
            "gpus": {"model": "H100-SXM", "count": gpus},
            "interval_s": interval,
            "summary_window_s": window,
            # most of the fleet trains (summaries carry the job), the rest idles
            "jobs": [
                {"id": 1000 + j, "nodes": f"sim-[{j * 100 + 1}-{j * 100 + 80}]"} for j in range(nodes // 100)
            ],
        },
        "<benchmark fleet>",
    )


async def measure(args: argparse.Namespace, engine: Daemon) -> dict[str, Any]:
    fleet = fleet_of(args.nodes, args.gpus, args.interval, args.window)
    sim = Simulator(fleet, engine.url, TOKEN, sample_in_thread=args.threaded)
    async with sim:
        await asyncio.sleep(args.warmup)
        before = await asyncio.to_thread(Scrape, engine.url)
        stats0 = sim.stats()
        e0, s0, t0 = proc_cpu_s(engine.proc.pid), self_cpu_s(), time.monotonic()
        behind_at_start = sim.max_behind_s
        next_line = t0 + 10
        while time.monotonic() - t0 < args.duration:
            await asyncio.sleep(max(0.0, min(next_line, t0 + args.duration) - time.monotonic()))
            if time.monotonic() >= next_line:
                print("  " + sim.stats().progress_line(), flush=True)
                next_line += 10
        e1, s1, t1 = proc_cpu_s(engine.proc.pid), self_cpu_s(), time.monotonic()
        after = await asyncio.to_thread(Scrape, engine.url)
        stats1 = sim.stats()
        mem = proc_mem_mib(engine.proc.pid)
        max_behind = max(sim.max_behind_s, behind_at_start)
    final = sim.stats()
    wall = t1 - t0
    buckets = {le: after.age_buckets[le] - before.age_buckets.get(le, 0.0) for le in after.age_buckets}
    n_age = after.age_count - before.age_count
    mean_age = (after.age_sum - before.age_sum) / n_age if n_age else float("nan")
    expected_window_age = args.window + args.interval / 2 if args.interval == args.window else float("nan")
    return {
        "nodes": args.nodes,
        "gpus": args.nodes * args.gpus,
        "interval_s": args.interval,
        "window_s": args.window,
        "sampling": "worker thread" if args.threaded else "inline",
        "measured_s": wall,
        "engine_cpu_cores": (e1 - e0) / wall,
        "engine_rss_mib": mem.get("VmRSS"),
        "engine_peak_rss_mib": mem.get("VmHWM"),
        "events_received_per_s": (after.received - before.received) / wall,
        "events_produced_per_s": (stats1.events - stats0.events) / wall,
        "ingest_age_mean_s": mean_age,
        "ingest_age_p95_s": quantile(buckets, 0.95),
        "ingest_age_p50_s": quantile(buckets, 0.50),
        "expected_window_age_s": expected_window_age,
        "engine_queue_depth_end": after.queue_depth,
        "sim_cpu_cores": (s1 - s0) / wall,
        "sim_max_behind_s": max_behind,
        "sim_queue_end": stats1.queued,
        "dropped": final.dropped,
        "dropped_detail": {
            "queue_full": final.dropped_queue_full,
            "rejected": final.dropped_rejected,
            "undelivered_at_stop": final.undelivered_at_stop,
        },
        "engine_ingest_refusals": after.rejected,
        "requests": final.requests,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--window", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=60.0, help="measured seconds (after the warm-up)")
    p.add_argument("--warmup", type=float, default=15.0)
    p.add_argument("--threaded", action="store_true", help="sample each tick in a worker thread")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    configure_logging("error", "json")

    with tempfile.TemporaryDirectory(prefix="watchd-fleet-") as tmp:
        work = Path(tmp)
        token_file = work / "token"
        token_file.write_text(TOKEN + "\n")
        config = engine_config(free_port(), token_file, "dry-run", None)
        config.update(
            rules=[str(ROOT / "rules")],
            state={"path": str(work / "engine.db")},
            log={"level": "warning", "format": "json"},
        )
        engine = Daemon("engine", config, work)
        try:
            engine.wait_ready()
            print(
                f"fleet: {args.nodes} nodes x {args.gpus} GPUs every {args.interval:g} s -> watchd engine "
                f"(pid {engine.proc.pid}, dry-run, rules/); warm-up {args.warmup:g} s, "
                f"then {args.duration:g} s",
                flush=True,
            )
            r = asyncio.run(measure(args, engine))
        finally:
            code = engine.stop()
        if code != 0:
            print(engine.log(), file=sys.stderr)

    print(f"\nwatchd fleet benchmark ({os.cpu_count()} cores, simulator and engine on the same machine)")
    print(
        f"  fleet      {r['nodes']} nodes, {r['gpus']} GPUs, interval {r['interval_s']:g} s, "
        f"window {r['window_s']:g} s, sampling {r['sampling']}, measured {r['measured_s']:.1f} s"
    )
    print(
        f"  engine     CPU {r['engine_cpu_cores']:.3f} cores   RSS {r['engine_rss_mib']:.0f} MiB "
        f"(peak {r['engine_peak_rss_mib']:.0f} MiB)   queue at end {r['engine_queue_depth_end']:.0f}"
    )
    print(
        f"  events     received {r['events_received_per_s']:.0f}/s   "
        f"(the simulator produced {r['events_produced_per_s']:.0f}/s)"
    )
    transport = r["ingest_age_mean_s"] - r["expected_window_age_s"]
    print(
        f"  ingest lag event age at ingest: mean {r['ingest_age_mean_s']:.2f} s, "
        f"p50 ~{r['ingest_age_p50_s']:.2f} s, p95 ~{r['ingest_age_p95_s']:.2f} s (buckets)"
    )
    print(
        f"             of which the summary window itself: {r['expected_window_age_s']:.2f} s on average; "
        f"transport ~{transport:.2f} s"
    )
    print(
        f"  simulator  CPU {r['sim_cpu_cores']:.3f} cores   sampling at most {r['sim_max_behind_s']:.2f} s "
        f"behind schedule   queue at end {r['sim_queue_end']}"
    )
    ok = r["dropped"] == 0 and r["engine_ingest_refusals"] == 0
    print(
        f"  dropped    {r['dropped']} {r['dropped_detail']}   "
        f"engine refusals {r['engine_ingest_refusals']:.0f}   requests {r['requests']}   "
        f"-> {'OK' if ok else 'EVENTS LOST'}"
    )
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
