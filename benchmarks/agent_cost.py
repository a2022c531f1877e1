"""The agent's own cost: CPU per sampling round and resident memory, sampling 8 (fake) GPUs every second.

A real `watchd agent` process (fake GPU backend, kmsg off) ships to a real `watchd engine` process (dry-run)
for --seconds; its CPU time comes from /proc/<pid>/stat and its RSS from /proc/<pid>/status. The floor is a
Python process that imports the same modules and sleeps: what the interpreter and libraries cost alone.
Targets: under 1% of one core and under 80 MB RSS. Run: ``.venv/bin/python benchmarks/agent_cost.py``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.daemons import Daemon, agent_config, engine_config, free_port  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--interval", type=float, default=1.0)
    args = p.parse_args()
    scenario = ROOT / "tests" / "gpu_scenarios" / "healthy_training.yaml"
    with tempfile.TemporaryDirectory(prefix="watchd-agent-cost-") as tmp:
        work = Path(tmp)
        token = work / "token"
        token.write_text("bench\n")
        engine_cfg = engine_config(free_port(), token, "dry-run", None)
        engine_cfg["log"] = {"level": "warning", "format": "json"}
        engine = Daemon("engine", engine_cfg, work)
        engine.wait_ready()
        cfg = agent_config("gpu-node-1", engine.port, token, work / "unused.log")
        cfg["sources"] = {
            "kmsg": {"enabled": False},
            "gpu": {"backend": "fake", "scenario": str(scenario), "interval_s": args.interval},
        }
        cfg["log"] = {"level": "warning", "format": "json"}
        agent = Daemon("agent", cfg, work)
        floor = subprocess.Popen(
            [sys.executable, "-c", "import watchd.agent.runner, watchd.gpu.sampler, time; time.sleep(1e6)"]
        )
        try:
            agent.wait_ready()
            time.sleep(3)  # past start-up (imports, first rounds)
            cpu0, t0 = cpu_seconds(agent.proc.pid), time.monotonic()
            time.sleep(args.seconds)
            cpu1, t1 = cpu_seconds(agent.proc.pid), time.monotonic()
            rss, floor_rss = rss_mib(agent.proc.pid), rss_mib(floor.pid)
            metrics = agent.get("/metrics")
        finally:
            floor.kill()
            agent.stop()
            engine.stop()
    elapsed = t1 - t0
    rounds = elapsed / args.interval
    core = (cpu1 - cpu0) / elapsed
    shipped = next(
        (
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("watchd_agent_events_shipped_total")
        ),
        0.0,
    )
    print(
        f"\nwatchd agent cost, 8 fake GPUs sampled every {args.interval:g} s for {elapsed:.0f} s "
        f"({os.cpu_count()} cores)"
    )
    print(
        f"  CPU: {core * 100:.2f}% of one core, {(cpu1 - cpu0) / rounds * 1000:.1f} ms per sampling round "
        f"(8 GPUs), {(cpu1 - cpu0) / rounds / 8 * 1000:.2f} ms per GPU sample   target < 1%: "
        f"{'met' if core < 0.01 else 'MISSED'}"
    )
    print(
        f"  RSS: {rss:.1f} MiB; floor (python + the same imports, idle) {floor_rss:.1f} MiB, "
        f"+{rss - floor_rss:.1f} MiB for the running agent   "
        f"target < 80 MB: {'met' if rss < 80 else 'MISSED'}"
    )
    print(f"  events shipped: {shipped:.0f} ({shipped / elapsed:.1f}/s: summaries per 5 s window per GPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
