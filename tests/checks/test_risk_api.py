"""``watchd checks plan`` against a running engine on loopback (fake scheduler, fake runner): the route's
document, the CLI's table and ``--json``, the events the planner counts arriving through the ingest path."""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from watchd.checks_cli import run_checks
from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.errors import UsageError
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.events import Event
from watchd.reach import connect

TOKEN = "t0ken"
NODES = ["gpu-1", "gpu-2", "gpu-3"]


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    fake = FakeScheduler()
    fake.add_nodes(NODES)
    config = EngineConfig.model_validate(
        {
            "listen": {"port": 0},
            "auth": {"token": TOKEN},
            "mode": "dry-run",
            "slurm": {"enabled": False},
            "fake": {"enabled": True, "nodes": NODES},
            "checks": {
                "enabled": True,
                "runner": "fake",
                "items": [
                    {
                        "name": "nhc",
                        "type": "command",
                        "command": ["/bin/true"],
                        "schedule": {"cron": "0 3 * * *"},  # no round at start: nothing passed yet
                        "partitions": ["all"],
                        "time_limit": "10m",
                        "planner": "risk",
                        "budget": {"gpu_hours": 2.0, "per": "1d"},
                    },
                    {
                        "name": "dcgm",
                        "type": "dcgm-diag",
                        "schedule": {"cron": "0 3 * * *"},
                        "nodes": ["gpu-*"],
                    },
                ],
            },
        }
    )
    async with Engine(config, scheduler=fake) as e:
        yield e


async def _get(engine: Engine, path: str) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        aiohttp.ClientSession(headers=headers) as s,
        s.get(f"http://127.0.0.1:{engine.port}{path}") as r,
    ):
        body: Any = await r.json()
        return r.status, body


async def test_plan_orders_by_risk_and_explains_it(engine: Engine) -> None:
    xid = Event(
        id="x1", node="gpu-2", source="kmsg", kind="xid", time=engine.clock.now() - 60,
        attrs={"xid": 79, "bucket": "RESTART_BM", "gpu": 0},
    )  # fmt: skip
    await engine.queue.put((xid, engine.clock.monotonic()))  # through the engine's queue, as ingested
    for _ in range(100):
        status, doc = await _get(engine, "/api/v1/checks/plan?check=nhc")
        if doc["plans"][0]["nodes"][1]["factors"]:
            break
        await asyncio.sleep(0.05)
    assert status == 200
    (p,) = doc["plans"]
    assert p["planner"] == "risk" and p["budget"]["gpu_hours"] == 2.0
    rows = p["nodes"]
    # never passed: all three are due by the floor; the order among them is by name, the event is a factor
    assert [r["node"] for r in rows] == NODES
    # the Xid 79 is a hardware event, and the engine's (dry-run) drain on it a failure: the lemon term
    assert [f["name"] for f in rows[1]["factors"]] == ["lemon", "hardware"]
    assert "lemon 32%: 1 failures in 28 days x7.1; 1 hardware events" in rows[1]["why"]
    # 10 minutes x 8 GPUs = 1.33 GPU-hours: one fits in 2; the others are due, so the floor takes them
    assert [r["plan"] for r in rows] == [
        "due (floor)",
        "due (floor): checked past the budget",
        "due (floor): checked past the budget",
    ]
    status, doc = await _get(engine, "/api/v1/checks/plan")
    assert [p["check"] for p in doc["plans"]] == ["nhc", "dcgm"]
    assert doc["plans"][1]["planner"] == "oldest_first"
    status, doc = await _get(engine, "/api/v1/checks/plan?check=nope")
    assert status == 404 and "no check named 'nope'" in str(doc["error"])


async def test_cli_prints_the_plan(engine: Engine) -> None:
    url = f"http://127.0.0.1:{engine.port}"

    def cli(*names: str, as_json: bool = False) -> str:
        out = io.StringIO()
        rc = run_checks("plan", [], list(names), connect(url), as_json, 10.0, out)
        assert rc == 0
        return out.getvalue()

    os.environ["WATCHD_TOKEN"] = TOKEN
    try:
        text = await asyncio.to_thread(cli, "nhc")
        assert text.splitlines()[0].startswith("nhc: planner risk; budget 2 GPU-hours per 24 h per partition")
        assert "gpu-1" in text and "never passed" in text and "due (floor)" in text
        doc = json.loads(await asyncio.to_thread(cli, as_json=True))
        assert len(doc["plans"]) == 2
        with pytest.raises(UsageError, match="HTTP 404"):
            await asyncio.to_thread(cli, "nope")
    finally:
        os.environ.pop("WATCHD_TOKEN", None)
