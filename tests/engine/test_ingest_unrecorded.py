"""A batch is refused (503 ``unrecorded``, so the agent sends it again) only when a decision made on one of
its own events could not be recorded: the failure of another write while it waits for its answer (the usage
ledger's flush, another batch's decision) refuses nothing. A real engine over real HTTP on loopback, its
SQLite database refusing writes through triggers."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.support import eventually, xid_event
from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.httputil import serve
from watchd.model.events import INGEST_PATH, Event, batch_to_wire

#: gpu-2's Xid calls a webhook (a decision with no intent: recorded once it has run to its audit record),
#: gpu-1's drains (recorded once its intent is written)
RULES = """rules:
  - name: hook
    match: {kind: xid, node: gpu-2}
    actions: [{webhook: {url: "%s/hook", retries: 0, timeout_s: 30}}]
  - {name: drain-it, match: {kind: xid, node: gpu-1}, actions: [drain]}
"""
REFUSE = """
CREATE TRIGGER refuse_gpu1_intents BEFORE INSERT ON intents WHEN NEW.node = 'gpu-1'
BEGIN SELECT RAISE(ABORT, 'intent refused by the test'); END;
CREATE TRIGGER refuse_usage BEFORE INSERT ON job_gpu_usage
BEGIN SELECT RAISE(ABORT, 'usage refused by the test'); END;
"""


class Hook:
    """A webhook receiver that answers only once released."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.called.set()
        await asyncio.wait_for(self.release.wait(), 30)
        return web.json_response({})


@pytest.fixture
async def hook() -> AsyncIterator[tuple[Hook, str]]:
    receiver = Hook()
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    async with serve(app, "127.0.0.1", 0) as port:
        try:
            yield receiver, f"http://127.0.0.1:{port}"
        finally:
            receiver.release.set()


async def post(engine: Engine, node: str, *events: Event) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{engine.port}{INGEST_PATH}", json=batch_to_wire(node, list(events))) as r,
    ):
        return r.status, json.loads(await r.text())


def summary(node: str) -> Event:
    now = time.time()
    attrs = {"gpu": 0, "job": "slurm:7", "window_s": 5.0, "window_start": now - 5, "power_mean": 300.0}
    return Event(id=f"s-{node}", node=node, source="nvml", kind="gpu_summary", time=now, attrs=attrs)  # type: ignore[arg-type]


async def test_only_a_batch_whose_own_decision_was_not_recorded_is_refused(
    tmp_path: Path, hook: tuple[Hook, str]
) -> None:
    receiver, url = hook
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES % url)
    state = tmp_path / "state.db"
    config = EngineConfig.model_validate(
        {
            "listen": {"port": 0},
            "rules": [str(rules)],
            "default_rules": False,
            "slurm": {"enabled": False},
            "state": {"path": str(state)},
            "mode": "dry-run",
        }
    )
    async with Engine(config, use_config_scheduler=False) as engine:
        assert await post(engine, "gpu-3", summary("gpu-3")) == (200, {"accepted": 1, "duplicates": 0})
        with sqlite3.connect(state) as db:
            db.executescript(REFUSE)

        # gpu-2's batch waits for its webhook's decision; meanwhile two writes that are not its own fail
        recorded = asyncio.create_task(post(engine, "gpu-2", xid_event("gpu-2", event_id="b2")))
        await asyncio.wait_for(receiver.called.wait(), 10)
        unrecorded = asyncio.create_task(post(engine, "gpu-1", xid_event("gpu-1", event_id="b1")))
        await eventually(lambda: engine.store.health.failures == 1, what="gpu-1's drain not recorded")
        await engine.usage.flush()  # the ledger holds gpu-3's window: its write is refused too
        assert engine.store.health.failures == 2
        receiver.release.set()

        assert await recorded == (200, {"accepted": 1, "duplicates": 0})
        status, reply = await unrecorded
        # it says which decision and why, not the failure of the usage flush that came after it
        assert status == 503 and "decisions not recorded: drain on gpu-1 not recorded" in str(
            reply["error"]
        ), reply
        assert "intent refused by the test" in str(reply["error"]) and "usage" not in str(reply["error"]), (
            reply
        )
        assert engine.metrics.ingest_rejected.labels("unrecorded")._value.get() == 1

        # the refused batch's ids were forgotten: sent again once the store takes writes, it is taken in
        with sqlite3.connect(state) as db:
            db.execute("DROP TRIGGER refuse_gpu1_intents")
        await eventually(engine.writable, what="the store writable again")
        assert await post(engine, "gpu-1", xid_event("gpu-1", event_id="b1")) == (
            200,
            {"accepted": 1, "duplicates": 0},
        )
        assert [i.rule for i in engine.store.intents.under("drain:gpu-1")] == ["drain-it"]
