"""The checks inside a running engine (fake scheduler, fake runner): the HTTP API, validation refused for an
admin's drain, and automatic validation when a repair system reports ``node_repaired``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.events import Event

TOKEN = "t0ken"


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2", "gpu-3"])
    await fake.drain({"gpu-1": "nccl busbw 312 GB/s < 80% of 450 GB/s"})
    fake.set_admin_drain("gpu-2", "bad DIMM")
    config = EngineConfig.model_validate(
        {
            "listen": {"port": 0},
            "auth": {"token": TOKEN},
            "mode": "enforce",
            "slurm": {"enabled": False},
            "fake": {"enabled": True, "nodes": ["gpu-1", "gpu-2", "gpu-3"]},
            "checks": {
                "enabled": True,
                "runner": "fake",
                "auto_validate": ["node_repaired"],
                "items": [{"name": "nhc", "type": "command", "command": ["/bin/true"]}],
            },
        }
    )
    async with Engine(config, scheduler=fake) as e:
        yield e


async def call(engine: Engine, method: str, path: str, body: object = None) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Watchd-Operator": "alice"}
    url = f"http://127.0.0.1:{engine.port}{path}"
    async with aiohttp.ClientSession(headers=headers) as s, s.request(method, url, json=body) as r:
        return r.status, await r.json()


async def test_api_lists_runs_and_refuses(engine: Engine) -> None:
    status, body = await call(engine, "GET", "/api/v1/checks")
    assert status == 200 and [c["name"] for c in body["checks"]] == ["nhc"]  # type: ignore[index]
    status, body = await call(engine, "POST", "/api/v1/checks/run", {"nodes": ["gpu-3", "nope"]})
    assert status == 200
    results = {r["node"]: r["outcome"] for r in body["results"]}  # type: ignore[union-attr]
    assert results == {"gpu-3": "passed", "nope": "skipped"}
    status, body = await call(engine, "POST", "/api/v1/checks/run", {"nodes": "gpu-3"})
    assert status == 400
    status, body = await call(engine, "POST", "/api/v1/nodes/gpu-2/validate")
    assert status == 409 and body["outcome"] == "refused"
    status, body = await call(engine, "POST", "/api/v1/nodes/gpu-3/validate")
    assert status == 200 and body["outcome"] == "not_drained"
    status, body = await call(engine, "GET", "/api/v1/checks/history/gpu-3")
    assert status == 200 and body["runs"][0]["outcome"] == "passed"  # type: ignore[index]
    assert "checks" in engine.status()


async def test_node_repaired_validates_the_node_by_itself(engine: Engine) -> None:
    event = Event(
        id="repair-1", node="gpu-1", source="repair-system", kind="node_repaired", time=engine.clock.now()
    )
    await engine.queue.put((event, engine.clock.monotonic()))
    for _ in range(100):
        done = [a for a in engine.recent_actions(50) if a["rule"] == "validate"]
        if done:
            break
        await asyncio.sleep(0.05)
    assert done and done[0]["outcome"] == "resumed" and "auto: node_repaired repair-1" in done[0]["detail"]
