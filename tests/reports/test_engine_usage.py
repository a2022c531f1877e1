"""The engine records what the usage report needs: GPU window summaries and heartbeats posted over real HTTP
to a running engine end up in its state database, and ``watchd report usage --state`` reads them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp
import pytest

from watchd.cli import main
from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.events import Event, batch_to_wire
from watchd.store.database import Store


def _summary(gpu: int, t: float, power: float, util: float) -> Event:
    attrs = {"gpu": gpu, "job": "slurm:77", "window_s": 5.0, "window_start": t - 5, "power_mean": power}
    attrs["util_mean"] = util
    return Event(id=f"s{gpu}-{t}", node="gpu-1", source="nvml", kind="gpu_summary", time=t, attrs=attrs)  # type: ignore[arg-type]


def _heartbeat(t: float, phase: str) -> Event:
    attrs = {"job": "slurm:77", "rank": 0, "step": 10, "phase": phase}
    return Event(id=f"h-{t}", node="gpu-1", source="heartbeat", kind="heartbeat", time=t, attrs=attrs)  # type: ignore[arg-type]


async def test_posted_windows_reach_the_state_and_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "watchd.db"
    cfg = EngineConfig.model_validate(
        {"listen": {"port": 0}, "slurm": {"enabled": False}, "state": {"path": str(state)}, "mode": "dry-run"}
    )
    now = time.time()
    events = [
        _summary(g, now - 60 + 5 * k, 400.0 if k < 6 else 100.0, 90.0 if k < 6 else 0.0)
        for g in (0, 1)
        for k in range(12)
    ]
    events += [_heartbeat(now - 40, "checkpoint"), _heartbeat(now - 30, "train")]
    engine = Engine(cfg, scheduler=FakeScheduler())
    async with engine:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"http://127.0.0.1:{engine.port}/api/v1/events", json=batch_to_wire("gpu-1", events)) as r,
        ):
            assert r.status == 200, await r.text()
        await engine.queue.join()
    # stopped: the ledger was flushed at shutdown
    store = Store.open(state)
    rows = store.usage.gpu_rows(now - 3600, now + 60)
    assert sorted((j, g, e, s, i) for j, _, g, e, s, i, _, _ in rows) == [
        ("77", 0, 6 * 5 * 400.0 + 6 * 5 * 100.0, 60.0, 30.0),
        ("77", 1, 6 * 5 * 400.0 + 6 * 5 * 100.0, 60.0, 30.0),
    ]
    assert store.usage.checkpoints() == {"77": (now - 40,)}
    store.close()
    out = tmp_path / "usage.json"
    argv = ["report", "usage", "--source", "none", "--state", str(state), "--since", "1h", "--format", "json"]
    assert main([*argv, "-o", str(out)]) == 0
    assert "accounting unavailable" in capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["accounting"] is False
    [row] = doc["rows"]
    assert row["energy_kwh"] == pytest.approx(2 * 15_000 / 3.6e6)
    assert row["idle_gpu_hours"] == pytest.approx(60 / 3600)
