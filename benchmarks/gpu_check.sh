#!/usr/bin/env bash
# One command on a machine with a real NVIDIA GPU (under 5 minutes): the agent against real NVML for 60 s.
# Saves its metrics, its logs and its CPU/RSS cost under ${OUT:-./gpu-check}. Needs the project's .venv
# (make venv) with nvidia-ml-py; reaches nothing outside the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu-check}
SECONDS_TO_RUN=${SECONDS_TO_RUN:-60}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
nvidia-smi -q > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi not available" > "$OUT/nvidia-smi.txt"
"$PY" - "$OUT" "$SECONDS_TO_RUN" <<'PY'
import json, os, sys, time, urllib.request
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
        "cpu_ms_per_round": round((c1 - c0) / (t1 - t0) * 1000, 2), "rss_mib": round(rss_mib(agent.proc.pid), 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
finally:
    agent.stop(); engine.stop()
PY
