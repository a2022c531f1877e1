"""The agent's own cost on NVML, per GPU per sampling round, with 1 and 8 GPUs, next to floors measured in the
same run. No GPU needed: the agents load the cost-faithful NVML stand-in (watchd/gpu/nvml_standin.py) in
place of ``pynvml``, whose every call spends the CPU and wall time that call was measured to cost on an
NVIDIA H200 (driver 580.159.04; the table in watchd/gpu/nvml_costs.json), and whose ``nvmlInit`` takes the
resident memory loading libnvidia-ml took there.

Real ``watchd agent`` processes (GPU backend ``nvml``, interval 1 s, kmsg off) ship to a real
``watchd engine`` (dry-run) for --seconds. Measured from /proc: each process's CPU time and RSS.

* agent with 0 GPUs: the agent's fixed cost (event loop, shipper, heartbeats, metrics): the CPU floor;
* agents with 1 and 8 GPUs: (their CPU - the 0-GPU agent's) / rounds / GPUs = the cost per GPU per round;
* the RSS floor: a Python process with the agent's imports and ``nvmlInit()`` (the stand-in's), idle.

Also printed: the modelled NVML CPU per GPU per round (the stand-in's own count over 60 rounds in-process:
what the same rounds cost on the H200 in NVML calls alone). Targets: <= 1 ms CPU per GPU per
round; RSS <= floor + 15 MiB. On real GPUs, ``benchmarks/gpu_check.sh`` measures the same against real NVML.
Run: ``.venv/bin/python benchmarks/agent_cost.py [--seconds 30]``.
"""

from __future__ import annotations

import argparse
import json
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
BUDGET_MS = 1.0
RSS_HEADROOM_MIB = 15.0

# Becomes ``pynvml`` in the agent processes: the stand-in, burning the measured costs for real.
SHIM = """
import os, sys
from watchd.gpu.nvml_standin import StandinNvml
sys.modules[__name__] = StandinNvml.h200(int(os.environ["WATCHD_STANDIN_GPUS"]), burn=True, rss=True)
"""
FLOOR = (
    "import watchd.agent.runner, watchd.gpu.sampler, watchd.gpu.nvml, watchd.gpu.registry, time, pynvml; "
    "pynvml.nvmlInit(); time.sleep(1e6)"
)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def modelled_ms_per_gpu(count: int, rounds: int = 60) -> float:
    """The stand-in's modelled NVML CPU per GPU per round (no burning, a manual clock), after the open."""
    from watchd.gpu.nvml import NvmlBackend
    from watchd.gpu.nvml_standin import StandinNvml

    t = [1_800_000_000.0]
    lib = StandinNvml.h200(count, clock=lambda: t[0])
    backend = NvmlBackend(lib=lib)
    gpus = backend.open()
    lib.take_charged_ms()
    for _ in range(rounds):
        t[0] += 1.0
        for g in gpus:
            backend.sample(g, t[0])
    backend.close()
    return lib.take_charged_ms() / rounds / count


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    interval = 1.0
    counts = (0, 1, 8)
    with tempfile.TemporaryDirectory(prefix="watchd-agent-cost-") as tmp:
        work = Path(tmp)
        shim_dir = work / "shim"
        shim_dir.mkdir()
        (shim_dir / "pynvml.py").write_text(SHIM)
        pythonpath = os.pathsep.join([str(shim_dir), str(ROOT), os.environ.get("PYTHONPATH", "")])
        token = work / "token"
        token.write_text("bench\n")
        engine_cfg = engine_config(free_port(), token, "dry-run", None)
        engine_cfg["log"] = {"level": "warning", "format": "json"}
        engine = Daemon("engine", engine_cfg, work)
        engine.wait_ready()
        agents: dict[int, Daemon] = {}
        floor = subprocess.Popen(
            [sys.executable, "-c", FLOOR],
            env={**os.environ, "PYTHONPATH": pythonpath, "WATCHD_STANDIN_GPUS": "1"},
        )
        try:
            for n in counts:
                cfg = agent_config(f"gpu-node-{n}", engine.port, token, work / "unused.log")
                cfg["sources"] = {
                    "kmsg": {"enabled": False},
                    "gpu": {"backend": "nvml", "interval_s": interval},
                }
                cfg["log"] = {"level": "warning", "format": "json"}
                env = {"PYTHONPATH": pythonpath, "WATCHD_STANDIN_GPUS": str(n)}
                agents[n] = Daemon("agent", cfg, work, env=env)
            for agent in agents.values():
                agent.wait_ready()
            time.sleep(5)  # past start-up (imports, open, the first rounds)
            t0 = time.monotonic()
            cpu0 = {n: cpu_seconds(a.proc.pid) for n, a in agents.items()}
            time.sleep(args.seconds)
            cpu1 = {n: cpu_seconds(a.proc.pid) for n, a in agents.items()}
            elapsed = time.monotonic() - t0
            rss = {n: rss_mib(a.proc.pid) for n, a in agents.items()}
            floor_rss = rss_mib(floor.pid)
            samples = {
                n: _metric(a.get("/metrics"), "watchd_gpu_last_sample_timestamp_seconds{")
                for n, a in agents.items()
            }
        finally:
            floor.kill()
            floor.wait()
            for agent in agents.values():
                agent.stop()
            engine.stop()
    rounds = elapsed / interval
    base = (cpu1[0] - cpu0[0]) / rounds * 1000  # ms per round, no GPU
    out: dict[str, object] = {
        "where": f"this machine ({os.cpu_count()} cores), NVML stand-in (H200 costs, driver 580.159.04)",
        "seconds": round(elapsed, 1),
        "agent_0_gpus_ms_per_round": round(base, 3),
        "floor_rss_mib": round(floor_rss, 1),
    }
    print(
        f"\nwatchd agent cost on the NVML stand-in (H200 costs), 1 s rounds for {elapsed:.0f} s "
        f"({os.cpu_count()} cores)"
    )
    print(f"  CPU floor: the agent with 0 GPUs, {base:.2f} ms per round ({base / 10:.3f}% of a core)")
    print(f"  RSS floor: python + the agent's imports + nvmlInit(), idle: {floor_rss:.1f} MiB")
    for n in counts[1:]:
        total = (cpu1[n] - cpu0[n]) / rounds * 1000
        per_gpu = (total - base) / n
        modelled = modelled_ms_per_gpu(n)
        ok = per_gpu <= BUDGET_MS
        rss_ok = rss[n] <= floor_rss + RSS_HEADROOM_MIB
        print(
            f"  {n} GPU{'s' if n > 1 else ' '}: {total:.2f} ms CPU per round ({total / 10:.3f}% of a core), "
            f"{per_gpu:.2f} ms per GPU above the floor (NVML calls modelled: {modelled:.2f}) "
            f"[budget {BUDGET_MS:g} ms: {'met' if ok else 'MISSED'}]; RSS {rss[n]:.1f} MiB = floor "
            f"{rss[n] - floor_rss:+.1f} [budget +{RSS_HEADROOM_MIB:g}: {'met' if rss_ok else 'MISSED'}]; "
            f"GPUs reporting {samples[n]:.0f}"
        )
        out[f"gpus_{n}"] = {
            "ms_per_round": round(total, 3),
            "ms_per_gpu_per_round_above_floor": round(per_gpu, 3),
            "modelled_nvml_ms_per_gpu_per_round": round(modelled, 3),
            "core_percent": round(total / 10, 3),
            "rss_mib": round(rss[n], 1),
            "rss_above_floor_mib": round(rss[n] - floor_rss, 1),
        }
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def _metric(text: str, prefix: str) -> float:
    return float(sum(1 for line in text.splitlines() if line.startswith(prefix)))


if __name__ == "__main__":
    raise SystemExit(main())
