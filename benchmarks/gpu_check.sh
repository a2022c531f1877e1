#!/usr/bin/env bash
# One command on a machine with a real NVIDIA GPU (under 5 minutes): first the cost of each NVML call the
# agent makes (CPU and wall ms, median of 20, next to the stand-in's table watchd/gpu/nvml_costs.json), then
# the agent against real NVML for 60 s: its CPU per round and per GPU, its RSS next to the floor (python +
# the agent's imports + nvmlInit()). Saves everything under ${OUT:-./gpu-check}. Needs the project's .venv
# (make venv) with nvidia-ml-py; reaches nothing outside the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu-check}
SECONDS_TO_RUN=${SECONDS_TO_RUN:-60}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
nvidia-smi -q > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi not available" > "$OUT/nvidia-smi.txt"
"$PY" - "$OUT" <<'PY'
import json, statistics, sys, time
from pathlib import Path
sys.path.insert(0, ".")
import pynvml
from watchd.gpu.nvml_standin import load_costs
out = Path(sys.argv[1]); costs = load_costs(); pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
calls = {
    "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
    "nvmlDeviceGetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
    "nvmlDeviceGetTemperature": lambda: pynvml.nvmlDeviceGetTemperature(h, 0),
    "nvmlDeviceGetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
    "nvmlDeviceGetEnforcedPowerLimit": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
    "nvmlDeviceGetTotalEnergyConsumption": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
    "nvmlDeviceGetClockInfo": lambda: pynvml.nvmlDeviceGetClockInfo(h, 1),
    "nvmlDeviceGetMaxClockInfo": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, 1),
    "nvmlDeviceGetCurrentClocksEventReasons": lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
    "nvmlDeviceGetTotalEccErrors": lambda: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0),
    "nvmlDeviceGetRemappedRows": lambda: pynvml.nvmlDeviceGetRemappedRows(h),
    "nvmlDeviceGetPcieReplayCounter": lambda: pynvml.nvmlDeviceGetPcieReplayCounter(h),
    "nvmlDeviceGetCurrPcieLinkGeneration": lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
    "nvmlDeviceGetCurrPcieLinkWidth": lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
    "nvmlDeviceGetComputeRunningProcesses": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
    "nvmlDeviceGetPcieThroughput": lambda: pynvml.nvmlDeviceGetPcieThroughput(h, 0),
    "fields 197+198": lambda: pynvml.nvmlDeviceGetFieldValues(h, [197, 198]),
    "field 230": lambda: pynvml.nvmlDeviceGetFieldValues(h, [230]),
}
rows = {}
print(f"{'call':44} {'cpu ms':>8} {'wall ms':>8}   table cpu/wall")
for name, fn in calls.items():
    cpu, wall = [], []
    try:
        for _ in range(20):
            c0, w0 = time.thread_time(), time.perf_counter(); fn()
            cpu.append((time.thread_time() - c0) * 1000); wall.append((time.perf_counter() - w0) * 1000)
    except pynvml.NVMLError as e:
        print(f"{name:44} {str(e):>17}"); rows[name] = str(e); continue
    c, w = statistics.median(cpu), statistics.median(wall)
    ref = costs.call(name) if name.startswith("nvml") else None
    print(f"{name:44} {c:8.3f} {w:8.3f}   " + (f"{ref.cpu_ms:g}/{ref.wall_ms:g}" if ref else ""))
    rows[name] = {"cpu_ms": round(c, 4), "wall_ms": round(w, 4)}
pynvml.nvmlShutdown()
(out / "nvml-calls.json").write_text(json.dumps(rows, indent=2))
PY
"$PY" - "$OUT" "$SECONDS_TO_RUN" <<'PY'
import json, subprocess, os, sys, time, urllib.request
from pathlib import Path
sys.path.insert(0, ".")
from tests.daemons import Daemon, engine_config, free_port
from benchmarks.agent_cost import cpu_seconds, rss_mib

out, seconds = Path(sys.argv[1]), float(sys.argv[2])
token = out / "token"; token.write_text("gpu-check\n")
engine = Daemon("engine", {**engine_config(free_port(), token, "dry-run", None), "rules": ["rules"]}, out)
engine.wait_ready()
agent = Daemon("agent", {
    "node": os.uname().nodename.split(".")[0],
    "engine": {"url": f"http://127.0.0.1:{engine.port}", "auth": {"token_file": str(token)}},
    "listen": {"host": "127.0.0.1", "port": free_port()},
    "sources": {"kmsg": {"enabled": os.access("/dev/kmsg", os.R_OK), "state_file": None},
                "gpu": {"backend": "nvml", "interval_s": 1.0}},
    "log": {"format": "json"},
}, out)
floor = subprocess.Popen([sys.executable, "-c",
    "import watchd.agent.runner, watchd.gpu.sampler, watchd.gpu.nvml, time, pynvml; pynvml.nvmlInit(); time.sleep(1e6)"])
try:
    agent.wait_ready()
    time.sleep(5)
    c0, t0 = cpu_seconds(agent.proc.pid), time.monotonic()
    time.sleep(seconds)
    c1, t1 = cpu_seconds(agent.proc.pid), time.monotonic()
    metrics = agent.get("/metrics")
    (out / "agent-metrics.txt").write_text(metrics)
    (out / "engine-status.json").write_text(json.dumps(engine.get_json("/api/v1/status"), indent=2))
    (out / "engine-actions.json").write_text(json.dumps(engine.get_json("/api/v1/actions?limit=1000"), indent=2))
    gpus = sum(1 for line in metrics.splitlines() if line.startswith("watchd_gpu_last_sample_timestamp_seconds{"))
    up = [line for line in metrics.splitlines() if line.startswith("watchd_source_up")]
    summary = {
        "gpus_seen": gpus, "source_up": up, "seconds": round(t1 - t0, 1),
        "cpu_percent_of_one_core": round((c1 - c0) / (t1 - t0) * 100, 3),
        "cpu_ms_per_round": round((c1 - c0) / (t1 - t0) * 1000, 2),
        "cpu_ms_per_gpu_per_round": round((c1 - c0) / (t1 - t0) * 1000 / max(1, gpus), 2),
        "rss_mib": round(rss_mib(agent.proc.pid), 1),
        "floor_rss_mib (python + agent imports + nvmlInit)": round(rss_mib(floor.pid), 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
finally:
    floor.kill(); agent.stop(); engine.stop()
PY
