"""What reading the InfiniBand/RoCE ports costs the agent: CPU per scan of a GPU node's 8 HCAs (one port each,
the full counters/ and hw_counters/ tree), against the agent's CPU floor measured in the same run.

The tree is tests/ib/tree.py's: eight ConnectX-7 NDR HCAs built from the port files prometheus/procfs recorded
from a ConnectX-4 (21 counters/, 25 hw_counters/ files each), on this machine's file system. A scan reads,
per port, the 4 state files, the 12 PortCounters error counters and the default hw_counters the recorded set
has (4 of 5): 160 files.

1. In process: CPU time (``time.thread_time``) of 2,000 scans: the reader alone, the judge alone, both.
2. Real ``watchd agent`` processes (GPU backend ``none``, kmsg off) shipping to a real ``watchd engine``,
   in the same windows for --seconds: the floor is the agent with ``sources.ib.enabled: false``; beside it
   the same agent reading the tree every second (``interval_s: 1``, 15 times the default rate, so the
   difference stands out of the noise): the difference per scan, and what the default 15 s cadence costs
   as a share of the floor. CPU from /proc/<pid>/task/*/schedstat (nanoseconds on a CPU, every thread;
   /proc/<pid>/stat counts 10 ms ticks, too coarse for a few milliseconds a second).

On a real HCA each ``counters/`` read is a performance-management query the kernel sends to the firmware
(wall time, mostly outside the agent's CPU); files here are plain files, so the figures are the agent's own
share: Python, syscalls, parsing and judging. Run: ``.venv/bin/python benchmarks/ib_cost.py [--seconds 30]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.agent_cost import rss_mib  # noqa: E402
from tests.daemons import Daemon, agent_config, engine_config, free_port  # noqa: E402
from tests.ib.tree import ndr_node  # noqa: E402
from watchd.ib.collector import IbPortSource  # noqa: E402
from watchd.ib.settings import IbConfig  # noqa: E402
from watchd.ib.sysfs import Snapshot  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` (schedstat: nanoseconds run)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total / 1e9


def in_process(root: Path, scans: int = 2000) -> dict[str, float]:
    """Microseconds of CPU per scan: reading, judging, both (best of 3 runs)."""
    source = IbPortSource("bench", IbConfig(root=root))
    snaps: list[Snapshot] = []
    read = judge = float("inf")
    for _ in range(3):
        t0 = time.thread_time()
        snaps = [source.reader.scan(1_800_000_000.0 + i * 15.0) for i in range(scans)]
        read = min(read, (time.thread_time() - t0) / scans * 1e6)
        source = IbPortSource("bench", IbConfig(root=root))
        t0 = time.thread_time()
        for snap in snaps:
            source.observe(snap)
        judge = min(judge, (time.thread_time() - t0) / scans * 1e6)
    files = sum(4 + len(p.counters) + len(p.hw_counters) for p in snaps[0].ports)
    return {
        "read_us": read,
        "judge_us": judge,
        "scan_us": read + judge,
        "files": files,
        "ports": len(snaps[0].ports),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="watchd-ib-cost-") as tmp:
        work = Path(tmp)
        tree = ndr_node(work / "node", 8)
        local = in_process(tree)
        token = work / "token"
        token.write_text("bench\n")
        engine_cfg = engine_config(free_port(), token, "dry-run", None)
        engine_cfg["log"] = {"level": "warning", "format": "json"}
        engine = Daemon("engine", engine_cfg, work)
        engine.wait_ready()
        agents: dict[str, Daemon] = {}
        try:
            for name, ib in (("floor", {"enabled": False}), ("ib", {"root": str(tree), "interval_s": 1.0})):
                cfg = agent_config(f"gpu-{name}", engine.port, token, work / "unused.log")
                cfg["sources"] = {"kmsg": {"enabled": False}, "gpu": {"backend": "none"}, "ib": ib}
                cfg["log"] = {"level": "warning", "format": "json"}
                agents[name] = Daemon("agent", cfg, work, env={"PYTHONPATH": str(ROOT)})
            for agent in agents.values():
                agent.wait_ready()
            time.sleep(5)  # past start-up
            scans0 = _scans(agents["ib"].get("/metrics"))
            cpu0 = {n: cpu_seconds(a.proc.pid) for n, a in agents.items()}
            t0 = time.monotonic()
            time.sleep(args.seconds)
            cpu1 = {n: cpu_seconds(a.proc.pid) for n, a in agents.items()}
            elapsed = time.monotonic() - t0
            scans = _scans(agents["ib"].get("/metrics")) - scans0
            rss = {n: rss_mib(a.proc.pid) for n, a in agents.items()}
        finally:
            for agent in agents.values():
                agent.stop()
            engine.stop()
    floor = (cpu1["floor"] - cpu0["floor"]) / elapsed * 1000  # ms of CPU per second
    with_ib = (cpu1["ib"] - cpu0["ib"]) / elapsed * 1000
    per_scan = (with_ib - floor) * elapsed / max(scans, 1)  # ms
    default = per_scan / 15.0  # ms per second at the default 15 s cadence
    out = {
        "where": f"this machine ({os.cpu_count()} cores), plain files",
        "tree": f"{local['ports']:.0f} HCAs x 1 port, {local['files']:.0f} files a scan",
        "in_process_us_per_scan": {k: round(local[k], 1) for k in ("read_us", "judge_us", "scan_us")},
        "seconds": round(elapsed, 1),
        "scans": scans,
        "floor_ms_per_s": round(floor, 3),
        "ib_1s_ms_per_s": round(with_ib, 3),
        "ms_per_scan_above_floor": round(per_scan, 3),
        "default_15s_share_of_floor_percent": round(default / floor * 100, 2) if floor > 0 else None,
        "rss_mib": {n: round(v, 1) for n, v in rss.items()},
    }
    print(f"\nInfiniBand port scans, {out['tree']} ({os.cpu_count()} cores, plain files)")
    print(
        f"  in process: read {local['read_us']:.0f} us + judge {local['judge_us']:.0f} us = "
        f"{local['scan_us']:.0f} us CPU per scan ({local['scan_us'] / local['files']:.1f} us a file)"
    )
    print(f"  agent floor (IB off): {floor:.2f} ms CPU per second ({floor / 10:.3f}% of a core)")
    print(
        f"  agent scanning every 1 s: {with_ib:.2f} ms CPU per second; {scans} scans in {elapsed:.0f} s: "
        f"{per_scan:.2f} ms per scan above the floor"
    )
    print(
        f"  at the default 15 s: {default * 1000:.0f} us CPU per second = "
        f"{out['default_15s_share_of_floor_percent']}% of the floor; RSS floor {rss['floor']:.1f} MiB, "
        f"with IB {rss['ib']:.1f} MiB"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def _scans(text: str) -> int:
    return int(
        sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("watchd_agent_ib_scans_total{")
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
