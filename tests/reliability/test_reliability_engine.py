"""End to end: a ``watchd engine`` process, GPU summaries and heartbeats over real HTTP, an Xid that drains
with hardware evidence; then ``watchd reliability`` (text, JSON, one job), the status API, the
``checkpoint_interval`` finding through the rules, the durable record across a restart, and
``promtool check metrics`` on the new metrics."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon, free_port, watchd_command
from tests.support import wait_for
from watchd.client import AdviceUnavailable, advised_checkpoint_interval
from watchd.model.events import Event, batch_to_wire, stable_id

pytestmark = pytest.mark.real
TOKEN = "tok"


def post(url: str, node: str, events: list[Event]) -> None:
    body = json.dumps(batch_to_wire(node, events)).encode()
    req = urllib.request.Request(
        f"{url}/api/v1/events",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200, r.read()


def summary(node: str, gpu: int, t: float) -> Event:
    attrs: dict[str, Any] = {"gpu": gpu, "model": "NVIDIA H200", "window_s": 60.0}
    return Event(stable_id(node, "sum", gpu, t), node, "nvml", "gpu_summary", t, attrs)


def heartbeat(node: str, job: str, phase: str, t: float, step: int) -> Event:
    attrs: dict[str, Any] = {"job": job, "rank": 0, "step": step, "phase": phase}
    return Event(stable_id(node, "hb", job, phase, t), node, "heartbeat", "heartbeat", t, attrs)


def start(tmp_path: Path, port: int) -> Daemon:
    (tmp_path / "token").write_text(TOKEN)
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "auth": {"token_file": str(tmp_path / "token")},
        "mode": "dry-run",
        "state": {"path": str(tmp_path / "state.db")},
        "reliability": {"interval_s": 0.5, "flush_s": 0.5},
        "log": {"format": "json"},
    }
    engine = Daemon("engine", config, tmp_path)
    engine.wait_ready()
    return engine


def cli(url: str, *args: str) -> str:
    res = subprocess.run(
        [*watchd_command(), "reliability", "--url", url, *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "WATCHD_TOKEN": TOKEN},  # reads need a credential where the engine has one
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_reliability_end_to_end(tmp_path: Path, promtool: str) -> None:
    port = free_port()
    engine = start(tmp_path, port)
    now = time.time()
    try:
        # two nodes of 2 GPUs each report every minute for two hours
        for node in ("gpu-1", "gpu-2"):
            post(
                engine.url, node, [summary(node, g, now - 7200 + 60 * i) for i in range(121) for g in (0, 1)]
            )
        # an Xid 79 on gpu-1 an hour ago: drained (dry-run) on hardware evidence = one failure
        xid = Event(
            "xid-1",
            "gpu-1",
            "kmsg",
            "xid",
            now - 3600,
            {
                "xid": 79,
                "bucket": "RESTART_BM",
                "pci_bus_id": "0000:3b:00.0",
                "message": "fallen off the bus",
            },
        )
        post(engine.url, "gpu-1", [xid])
        # an application Xid is no failure
        app = Event("xid-2", "gpu-2", "kmsg", "xid", now - 1800, {"xid": 13, "bucket": "RESTART_APP"})
        post(engine.url, "gpu-2", [app])
        # job slurm:7 checkpoints for 60 s every 1740 s; slurm:8 checkpointed once, 6840 s ago
        post(
            engine.url,
            "gpu-2",
            [
                heartbeat("gpu-2", "slurm:7", "train", now - 3000, 1),
                heartbeat("gpu-2", "slurm:7", "checkpoint", now - 2400, 2),
                heartbeat("gpu-2", "slurm:7", "train", now - 2340, 2),
                heartbeat("gpu-2", "slurm:7", "checkpoint", now - 600, 3),
                heartbeat("gpu-2", "slurm:7", "train", now - 540, 3),
                heartbeat("gpu-2", "slurm:8", "train", now - 7000, 1),
                heartbeat("gpu-2", "slurm:8", "checkpoint", now - 6900, 2),
                heartbeat("gpu-2", "slurm:8", "train", now - 6840, 2),
                heartbeat("gpu-2", "slurm:8", "train", now - 10, 900),
            ],
        )

        def advised() -> Any:
            doc = engine.get_json("/api/v1/reliability")
            return doc if len(doc["jobs"]) == 2 else None

        doc = wait_for(advised, what="advice for both jobs")
        assert doc["fleet"]["failures"] == 1
        # gpu-1 in service until the failure (1 h), gpu-2 two hours: 3 node-hours
        assert doc["fleet"]["exposure_hours"] == pytest.approx(3.0, abs=0.05)
        assert doc["fleet"]["mtbf_hours"] == pytest.approx(3.0, abs=0.05)
        assert doc["fleet"]["mtbf_lower_hours"] < 3.0 < doc["fleet"]["mtbf_upper_hours"]
        assert doc["gpu_models"]["NVIDIA H200"]["failures"] == 1
        assert doc["nodes"]["gpu-1"]["failures"] == 1 and doc["nodes"]["gpu-2"]["failures"] == 0
        [failure] = doc["failures"]
        assert failure["node"] == "gpu-1" and failure["evidence"] == "xid 79 (RESTART_BM)"
        assert failure["rule"] == "xid-fatal-hardware" and failure["mode"] == "dry-run"
        assert failure["back_at"] is None  # still out: its summaries since carry no new job
        assert failure["gpu_hours_lost"] == pytest.approx(2.0, abs=0.05)  # 2 GPUs x 1 h
        jobs = {a["job"]: a for a in doc["jobs"]}
        seven = jobs["slurm:7"]
        assert seven["checkpoint_cost_s"] == pytest.approx(60.0) and seven["cost_source"] == "heartbeats"
        assert seven["current_interval_s"] == pytest.approx(1740.0)
        assert seven["advised_interval_s"] < seven["young_interval_s"]
        assert not seven["far_too_long"] and jobs["slurm:8"]["far_too_long"]

        # what a training loop reads (watchd.client), asking the engine directly: the advice, or the reason
        # there is none (AdviceUnavailable); reads need a credential where the engine has one
        with pytest.raises(AdviceUnavailable) as refused:
            advised_checkpoint_interval("slurm:7", url=engine.url)
        assert refused.value.reason == "refused"
        advised = advised_checkpoint_interval("slurm:7", url=engine.url, token=TOKEN)
        assert advised == seven["advised_interval_s"]
        with pytest.raises(AdviceUnavailable) as unknown:
            advised_checkpoint_interval("slurm:99", url=engine.url, token=TOKEN)
        assert unknown.value.reason == "unknown_job" and "no heartbeats" in unknown.value.detail
        with pytest.raises(AdviceUnavailable) as away:
            advised_checkpoint_interval("slurm:7", url=f"http://127.0.0.1:{free_port()}")
        assert away.value.reason == "engine_unreachable"

        text = cli(engine.url)
        assert "fleet: 1 failure in 3.0 node-h: MTBF 3.0 h (90%:" in text
        assert "(few failures: wide interval)" in text
        assert "xid 79 (RESTART_BM)" in text and "far less often than advised" in text
        one = json.loads(cli(engine.url, "--job", "slurm:7", "--json"))
        assert one["job"]["advised_interval_s"] == seven["advised_interval_s"]
        assert json.loads(cli(engine.url, "--since", "30m", "--json"))["fleet"]["failures"] == 0

        status = engine.get_json("/api/v1/status")["reliability"]
        assert status["failures"] == 1 and status["jobs_far_off"] == ["slurm:8"]

        def finding() -> Any:
            actions = engine.get_json("/api/v1/actions?limit=1000")["actions"]
            return [a for a in actions if a["rule"] == "checkpoint-interval-long"]

        [alert] = wait_for(finding, what="the checkpoint finding's alert")
        assert alert["action"] == "alert" and "slurm:8" in alert["params"]["summary"]

        metrics = engine.get("/metrics")
        assert 'watchd_reliability_failures{name="all",scope="partition"} 1.0' in metrics
        assert 'watchd_checkpoint_advised_interval_seconds{job="slurm:7"}' in metrics
        res = subprocess.run([promtool, "check", "metrics"], input=metrics, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
    finally:
        assert engine.stop() == 0, engine.log()

    # the record is durable: a new engine on the same state database reports the same failure and exposure
    engine = start(tmp_path, port)
    try:
        doc = engine.get_json("/api/v1/reliability")
        assert doc["fleet"]["failures"] == 1
        assert doc["fleet"]["exposure_hours"] == pytest.approx(3.0, abs=0.05)
        with pytest.raises(urllib.error.HTTPError) as err:
            engine.get("/api/v1/reliability?since=yesterday")
        assert err.value.code == 400
        with pytest.raises(urllib.error.HTTPError) as err:
            engine.get("/api/v1/reliability?job=slurm:99")
        assert err.value.code == 404
    finally:
        engine.stop()
