"""The database lease and its fencing token on a real PostgreSQL (issue 22): one holder at a time, a takeover
increments the token, and a deposed holder's writes and side effects are refused by the database's answer,
not by its own belief."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence

import pytest

from tests.harness.postgres import PostgresServer
from watchd.actions.leader_gate import LeaderGate
from watchd.integrations.base import SCHEDULER_VERBS, DrainResult, NodeState, RequeueResult, ResumeResult
from watchd.integrations.dblease import DatabaseLease, lease_from_settings
from watchd.port import gated
from watchd.store.connection import Fenced
from watchd.store.database import Store

pytestmark = pytest.mark.real

FAST = {"lease_duration_s": 1.5, "renew_deadline_s": 1.0, "retry_period_s": 0.2}


class RecordingScheduler:
    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def node_states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        return {}

    async def pools(self) -> dict[str, list[str]]:
        return {}

    async def drain(
        self, reasons: Mapping[str, str], states: Mapping[str, NodeState] | None = None
    ) -> dict[str, DrainResult]:
        self.calls += [("drain", n) for n in reasons]
        return {n: DrainResult(n, "drained") for n in reasons}

    async def requeue_jobs_on(self, node: str, job: str | None = None) -> RequeueResult:
        self.calls.append(("requeue", node))
        return RequeueResult(node)

    async def resume(self, node: str) -> ResumeResult:
        self.calls.append(("resume", node))
        return ResumeResult(node, "resumed")


class Engine:
    """What one engine holds: its store connection, fenced by its lease."""

    def __init__(self, pg: PostgresServer, dsn: str, identity: str) -> None:
        self.store = Store.open_postgres(dsn, pg.password)
        self.lease: DatabaseLease = lease_from_settings(
            dsn, pg.password, name="watchd-engine", identity=identity, **FAST
        )
        self.store.connection.fence = self.lease
        self.errors: list[str] = []
        self.store.on_error(lambda op, err: self.errors.append(op))


@pytest.fixture
async def pair(pg_server: PostgresServer) -> AsyncIterator[tuple[Engine, Engine]]:
    dsn = pg_server.dsn(pg_server.create_database())
    a, b = Engine(pg_server, dsn, "engine-a"), Engine(pg_server, dsn, "engine-b")
    yield a, b
    for e in (a, b):
        await e.lease.stop()
        e.store.close()


async def test_one_holder_and_its_writes_only(pair: tuple[Engine, Engine]) -> None:
    a, b = pair
    assert await a.lease.try_acquire_or_renew()
    assert not await b.lease.try_acquire_or_renew()
    assert a.lease.token == 1 and b.lease.token is None and b.lease.holder == "engine-a"
    a.lease._set(True)
    a.store.meta.set("k", "from a")
    with pytest.raises(Fenced, match="not the leader"):
        b.store.meta.set("k", "from b")
    assert a.store.meta.get("k") == "from a"
    assert b.store.health.writable and b.errors == ["fenced"]  # refused, not a broken database
    assert await a.lease.confirm() and not await b.lease.confirm()


async def test_a_holder_that_stops_renewing_is_deposed_and_fenced(pair: tuple[Engine, Engine]) -> None:
    a, b = pair
    a.lease.start()
    assert await a.lease.wait_leader(5)
    b.lease.start()
    await asyncio.sleep(0.6)
    assert not b.lease.is_leader  # renewed every 0.2 s: never expires
    # a pauses (its task stops: no renewal, no release) but still believes it leads, as after SIGSTOP
    assert a.lease._task is not None
    a.lease._task.cancel()
    a.lease._task = None
    assert await b.lease.wait_leader(5)
    assert b.lease.token == 2 and a.lease.is_leader and a.lease.token == 1
    with pytest.raises(Fenced, match="fencing token 1 is no longer current"):
        a.store.intents.set_cooldown("drain:gpu-1", 99.0)
    assert a.store.intents.cooldown_until("drain:gpu-1") is None
    b.store.intents.set_cooldown("drain:gpu-1", 99.0)
    # side effects: a's gate asks the database right before the call, and refuses
    scheduler = RecordingScheduler()
    deposed = gated(scheduler, SCHEDULER_VERBS, LeaderGate(a.lease).now)
    assert (await deposed.drain({"gpu-1": "x"}))["gpu-1"].outcome == "failed"
    assert (await deposed.resume("gpu-1")).outcome == "failed"
    assert not (await deposed.requeue_jobs_on("gpu-1")).ok
    assert await LeaderGate(a.lease).refusal("drain of gpu-1") is not None
    assert scheduler.calls == []
    leader = gated(scheduler, SCHEDULER_VERBS, LeaderGate(b.lease).now)
    assert (await leader.drain({"gpu-1": "x"}))["gpu-1"].outcome == "drained"
    assert scheduler.calls == [("drain", "gpu-1")]


async def test_a_clean_stop_hands_over_within_a_round(pair: tuple[Engine, Engine]) -> None:
    a, b = pair
    a.lease.start()
    assert await a.lease.wait_leader(5)
    b.lease.start()
    await a.lease.stop()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await b.lease.wait_leader(2)
    assert loop.time() - started < 1.0  # not a lease duration: released, taken at the next round
    assert b.lease.token == 2


async def test_a_takeover_waits_for_a_write_in_progress(pair: tuple[Engine, Engine]) -> None:
    a, b = pair
    assert await a.lease.try_acquire_or_renew()
    a.lease._set(True)
    conn = a.store.connection
    with conn.write("a slow write") as tx:  # holds the lease row's share lock until commit
        tx.execute("INSERT INTO meta (key, value) VALUES (?, ?)", ("slow", "a"))
        await asyncio.sleep(FAST["lease_duration_s"] + 0.2)  # the lease expires meanwhile
        assert not await b.lease.try_acquire_or_renew()  # blocked by the lock: times out, no takeover
    assert a.store.meta.get("slow") == "a"  # committed under a's token
    assert await b.lease.try_acquire_or_renew() and b.lease.token == 2
    with pytest.raises(Fenced):
        a.store.meta.set("after", "a")
