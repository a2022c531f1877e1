"""Issue 16 items 1-4 at the unit level: the store failing (text it cannot encode, a write that fails, a
finish never written) never blocks a node nor loses an audit record; its health is reported; after a crash,
finished intents without their audit record are audited as recovered, and a dry-run drain gets its requeue."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from tests.actions.test_executor import make, rule_engine
from tests.support import xid_event
from watchd.actions.audit import AuditRecord
from watchd.clock import FakeClock
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.store import connection
from watchd.store.connection import StoreError, text
from watchd.store.database import Store
from watchd.store.intents import ABANDONED


@pytest.fixture
def store() -> Iterator[Store]:
    with Store.open(":memory:") as s:
        yield s


def begin(s: Store, key: str = "drain:gpu-1", at: float = 100.0) -> bool:
    return s.intents.begin(key, "drain", "gpu-1", "xid-79", "e1", {"reason": "Xid 79"}, at, at + 600)


class _FailingWrites:
    """Makes every statement of a write transaction fail as a full disk does, while ``on``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        real = connection.Tx.execute

        def execute(tx: connection.Tx, sql: str, args: Any = ()) -> sqlite3.Cursor:
            if self.on:
                raise sqlite3.OperationalError("database or disk is full")
            return real(tx, sql, args)

        monkeypatch.setattr(connection.Tx, "execute", execute)


# ---------------------------------------------------------------------------------------------- encoding


def test_text_escapes_only_lone_surrogates() -> None:
    assert text("gpu-1") == "gpu-1"
    assert text("gpü-✓") == "gpü-✓"
    assert text("gpu-3\udc80") == "gpu-3\\udc80"


def test_a_lone_surrogate_is_stored_escaped_everywhere(store: Store) -> None:
    node = "gpu-3\udc80"
    store.audit.append(AuditRecord(1.0, "r", "bad-2", node, "drain", "dry-run", "dry_run", "pci \udc80"))
    [rec] = store.audit.recent(10, node=node)
    assert rec.node == "gpu-3\\udc80" and rec.detail == "pci \\udc80"
    key = f"drain:{node}"
    assert begin(store, key)
    assert store.intents.finish(key, "drained", "reason \udc80", 101.0)
    assert [i.outcome for i in store.intents.under(key)] == ["drained"]
    store.breaker.record("gpu", node, 1.0)
    store.meta.set("k\udc80", "v\udc80")
    assert store.meta.get("k\udc80") == "v\\udc80"
    assert store.health.writable and store.health.failures == 0


def test_any_driver_exception_is_a_store_error_naming_the_file(store: Store) -> None:
    with pytest.raises(StoreError, match=r":memory:.*doing it"), store._db.write("doing it") as tx:
        tx.execute("SELECT ?", (2**70,))  # OverflowError from the driver, not a sqlite3.Error
    with pytest.raises(StoreError, match="reading it"):
        store._db.one("reading it", "SELECT ?", (2**70,))
    assert store.health.failures == 1  # the failed write; a failed read does not make it unwritable
    assert not store.health.writable


# ------------------------------------------------------------------------------------------- stale intents


def test_a_finish_not_written_is_written_by_the_next_decision_then_its_cooldown_applies(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = _FailingWrites(monkeypatch)
    assert begin(store)
    assert store.intents.in_flight("drain:gpu-1")
    failing.on = True
    with pytest.raises(StoreError, match="disk is full"):
        store.intents.finish("drain:gpu-1", "drained", "watchd: x", 101.0)
    failing.on = False
    assert not store.intents.in_flight("drain:gpu-1")
    assert store.intents.unwritten() == 1 and store.intents.stale() == []  # known: not to be driven again
    # the next decision under its key writes the finish as it was (not abandoned), and its cooldown holds
    assert not begin(store, at=102.0)
    intents = store.intents.under("drain:gpu-1")
    assert [(i.outcome, i.detail, i.finished_at) for i in intents] == [("drained", "watchd: x", 101.0)]
    assert store.intents.unwritten() == 0
    assert begin(store, at=701.0)  # past the cooldown


def test_a_failed_action_whose_finish_was_not_written_lets_the_next_decision_act(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = _FailingWrites(monkeypatch)
    assert begin(store)
    failing.on = True
    with pytest.raises(StoreError):
        store.intents.finish("drain:gpu-1", "failed", "scontrol: refused", 101.0, cooldown_until=100.0)
    failing.on = False
    assert begin(store, at=102.0)  # its cooldown was lifted with its finish
    assert [(i.outcome, i.finished) for i in store.intents.under("drain:gpu-1")] == [
        ("failed", True),
        (None, False),
    ]


def test_finishes_not_written_are_written_once_the_store_takes_writes(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = _FailingWrites(monkeypatch)
    for node in ("gpu-1", "gpu-2"):
        assert store.intents.begin(f"drain:{node}", "drain", node, "r", "e", {}, 100.0, 700.0)
    failing.on = True
    for node in ("gpu-1", "gpu-2"):
        with pytest.raises(StoreError):
            store.intents.finish(f"drain:{node}", "drained", "", 101.0)
    with pytest.raises(StoreError):
        store.intents.write_unwritten()  # still full: kept
    assert store.intents.unwritten() == 2
    failing.on = False
    assert store.intents.write_unwritten() == 2
    assert store.intents.unfinished() == [] and store.intents.unwritten() == 0
    assert store.intents.write_unwritten() == 0


def test_a_cancelled_action_leaves_its_intent_stale_not_blocking(store: Store) -> None:
    assert begin(store)
    store.intents.forget("drain:gpu-1")
    assert [i.key for i in store.intents.stale()] == ["drain:gpu-1"]  # outcome unknown: driven again
    assert begin(store, at=101.0)  # ... or replaced by the next decision, its cooldown not counted
    intents = store.intents.under("drain:gpu-1")
    assert [(i.outcome, i.finished) for i in intents] == [(ABANDONED, True), (None, False)]


def test_an_unfinished_intent_of_another_process_still_holds_its_key(tmp_path: Any) -> None:
    path = tmp_path / "state.db"
    with Store.open(path) as engine, Store.open(path) as other:
        assert begin(engine)
        assert not begin(other, at=101.0)
    with Store.open(path) as restarted:  # a previous incarnation's: recovery adopts and re-drives it
        assert not begin(restarted, at=102.0)
        restarted.intents.adopt("drain:gpu-1")
        assert not begin(restarted, at=102.0)


# ------------------------------------------------------------------------------------------------- health


def test_a_failed_write_marks_the_store_unwritable_until_a_write_succeeds(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, str]] = []
    store.on_error(lambda op, err: seen.append((op, str(err))))
    failing = _FailingWrites(monkeypatch)
    failing.on = True
    assert not store.probe(1.0)
    assert not store.health.writable and "disk is full" in store.health.reason
    assert seen == [("write", ":memory:: setting meta write_probe: database or disk is full")]
    failing.on = False
    assert store.probe(2.0)
    assert store.health.writable and store.health.reason == ""
    assert store.health.failures == 1 and "disk is full" in store.health.last_error


def test_open_probes_a_write(tmp_path: Any) -> None:
    path = tmp_path / "state.db"
    with Store.open(path) as s:
        assert s.meta.get("write_probe") is not None


# ---------------------------------------------------------------------------------------------- pipeline


async def test_a_drain_whose_finish_failed_does_not_block_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    executor, audit, clock = make(fake)
    failing = _FailingWrites(monkeypatch)
    real_finish = executor.store.intents.finish
    fail_once = [True]

    def finish(key: str, *args: Any, **kw: Any) -> bool:
        failing.on = fail_once[0] and key == "drain:gpu-1"  # the disk is full just then
        fail_once[0] = fail_once[0] and not failing.on
        try:
            return real_finish(key, *args, **kw)
        finally:
            failing.on = False

    monkeypatch.setattr(executor.store.intents, "finish", finish)
    rules = rule_engine()
    async with executor:
        for decision in rules.evaluate(xid_event("gpu-1", event_id="e1")):
            executor.submit(decision, 0.0)
        await executor.drain_in_flight(5)
        assert [i.key for i in executor.store.intents.unfinished()] == ["drain:gpu-1"]
        clock.advance(1.0)
        for decision in rules.evaluate(xid_event("gpu-1", event_id="e2")):
            executor.submit(decision, 0.0)
        await executor.drain_in_flight(5)
    drains = [a.outcome for a in audit.entries if a.action == "drain"]
    # the first drain ran and is audited as it went; its finish, kept, is written by the next decision on
    # the node, which is within the cooldown: de-duplicated, the node drained once
    assert drains == ["drained", "deduplicated"], drains
    assert [list(c[1]) for c in fake.calls if c[0] == "drain"] == [["gpu-1"]]
    assert executor.store.intents.unfinished() == []
    assert executor.store.health.writable


async def test_deciding_lists_the_decisions_not_yet_run() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    executor, _, _ = make(fake)
    async with executor:
        for decision in rule_engine().evaluate(xid_event("gpu-1")):
            executor.submit(decision, 0.0)
        pending = executor.deciding()
        assert pending
        await asyncio.wait(pending)
        assert executor.deciding() == set()


# ---------------------------------------------------------------------------------------------- recovery


async def test_a_finished_intent_never_audited_is_audited_as_recovered_once(tmp_path: Any) -> None:
    db = tmp_path / "state.db"
    now = 1_700_000_000.0
    with Store.open(db) as crashed:
        crashed.intents.begin("drain:n1", "drain", "n1", "fatal", "e-n1", {"reason": "x"}, now)
        crashed.intents.finish("drain:n1", "drained", "watchd: x", now + 1)  # killed before its audit
        crashed.intents.begin("drain:n2", "drain", "n2", "fatal", "e-n2", {"reason": "x"}, now)
        crashed.intents.finish("drain:n2", "drained", "watchd: x", now + 1)
        crashed.audit.append(AuditRecord(now + 1, "fatal", "e-n2", "n2", "drain", "enforce", "drained"))
    fake = FakeScheduler()
    fake.add_nodes(["n1", "n2"])
    for attempt in range(2):  # a second restart adds nothing
        with Store.open(db) as store:
            executor, audit, _ = make(fake, store=store, clock=FakeClock(now + 5 + attempt))
            async with executor:
                await executor.drain_in_flight(5)
            recovered = [(a.node, a.outcome, a.event_id) for a in audit.entries]
            assert recovered == ([("n1", "drained", "e-n1")] if attempt == 0 else []), recovered
            assert all("recovered after a restart" in a.detail for a in audit.entries)
    with Store.open(db) as store:
        assert [(a.node, a.event_id) for a in store.audit.recent(10)] == [("n2", "e-n2"), ("n1", "e-n1")]


def test_a_deduplicated_record_of_a_resent_event_is_not_the_audit_of_its_intent(store: Store) -> None:
    """The batch was answered 503 (another write failed), the agent sent it again: the re-sent decision is
    de-duplicated and audited as such, while the first one's own audit record could not be written."""
    assert begin(store)
    assert store.intents.finish("drain:gpu-1", "drained", "", 101.0)
    store.audit.append(AuditRecord(102.0, "xid-79", "e1", "gpu-1", "drain", "enforce", "deduplicated"))
    assert [i.key for i in store.intents.unaudited(0.0)] == ["drain:gpu-1"]
    store.audit.append(AuditRecord(103.0, "xid-79", "e1", "gpu-1", "drain", "enforce", "drained"))
    assert store.intents.unaudited(0.0) == []


async def test_dry_run_a_redriven_drain_gets_its_requeue(tmp_path: Any) -> None:
    db = tmp_path / "state.db"
    now = 1_700_000_000.0
    follows = {"reason": "Xid 79", "requeue_follows": True}
    with Store.open(db) as crashed:
        crashed.intents.begin("drain:n1", "drain", "n1", "fatal", "e-n1", follows, now)  # unfinished
        crashed.intents.begin("drain:n2", "drain", "n2", "fatal", "e-n2", follows, now)
        crashed.intents.finish("drain:n2", "dry_run", "", now)  # finished, requeue never began
        crashed.audit.append(AuditRecord(now, "fatal", "e-n2", "n2", "drain", "dry-run", "dry_run"))
    fake = FakeScheduler()
    fake.add_nodes(["n1", "n2"])
    fake.add_job("j1", ["n1"], requeue=True)
    with Store.open(db) as store:
        executor, audit, _ = make(fake, mode="dry-run", store=store, clock=FakeClock(now + 5))
        async with executor:
            await executor.drain_in_flight(5)
            await asyncio.sleep(0.05)
            await executor.drain_in_flight(5)
        got = sorted((a.node, a.action, a.outcome, a.mode) for a in audit.entries)
        assert got == [
            ("n1", "drain", "dry_run", "dry-run"),
            ("n1", "requeue", "dry_run", "dry-run"),
            ("n2", "requeue", "dry_run", "dry-run"),
        ], got
        assert store.intents.unfinished() == []
    assert fake.jobs["j1"].state == "running"  # dry-run touched nothing


async def test_a_finish_not_written_is_written_once_the_store_takes_writes_not_driven_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    executor, audit, _ = make(fake)
    failing = _FailingWrites(monkeypatch)
    real_finish = executor.store.intents.finish
    fail_once = [True]

    def finish(key: str, *args: Any, **kw: Any) -> bool:
        failing.on = fail_once[0] and key == "drain:gpu-1"
        fail_once[0] = fail_once[0] and not failing.on
        try:
            return real_finish(key, *args, **kw)
        finally:
            failing.on = False

    monkeypatch.setattr(executor.store.intents, "finish", finish)
    async with executor:
        for decision in rule_engine().evaluate(xid_event("gpu-1")):
            executor.submit(decision, 0.0)
        await executor.drain_in_flight(5)
        assert [i.key for i in executor.store.intents.unfinished()] == ["drain:gpu-1"]
        assert executor.store.intents.stale() == []  # its outcome is known: nothing to drive again
        assert executor.catch_up() == 0
        await executor.drain_in_flight(5)
    [intent] = executor.store.intents.under("drain:gpu-1")
    assert intent.outcome == "drained"
    assert [(a.action, a.outcome) for a in audit.entries if a.action == "drain"] == [("drain", "drained")]
    assert [list(c[1]) for c in fake.calls if c[0] == "drain"] == [["gpu-1"]]


async def test_an_audit_record_not_written_is_written_once_the_store_takes_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    executor, _, _ = make(fake)
    failing = _FailingWrites(monkeypatch)
    real_append = executor.store.audit.append

    def append(entry: AuditRecord) -> None:
        failing.on = entry.action == "drain" and not entry.detail.startswith("audited once")
        try:
            real_append(entry)
        finally:
            failing.on = False

    monkeypatch.setattr(executor.store.audit, "append", append)
    async with executor:
        for decision in rule_engine().evaluate(xid_event("gpu-1")):
            executor.submit(decision, 0.0)
        await executor.drain_in_flight(5)
        assert [a for a in executor.store.audit.recent(10, node="gpu-1") if a.action == "drain"] == []
        executor.catch_up()
        executor.catch_up()  # a second call adds nothing
    [record] = [a for a in executor.store.audit.recent(10, node="gpu-1") if a.action == "drain"]
    assert record.outcome == "drained" and record.detail.startswith(
        "audited once the state database took writes again"
    ), record
    assert executor.store.intents.unfinished() == []


async def test_a_decision_counts_as_recorded_once_its_intent_is_written() -> None:
    """The ingest reply waits for this, not for the scheduler (a follower waiting for the lease)."""
    gate = asyncio.Event()

    class Slow(FakeScheduler):
        async def apply_drain(self, *args: Any, **kw: Any) -> Any:
            await gate.wait()
            return await super().apply_drain(*args, **kw)

    fake = Slow()
    fake.add_nodes(["gpu-1"])
    executor, _, _ = make(fake)
    async with executor:
        for decision in rule_engine().evaluate(xid_event("gpu-1")):
            executor.submit(decision, 0.0)
        await asyncio.wait_for(asyncio.wait(executor.deciding()), 2)
        assert [i.key for i in executor.store.intents.unfinished()] == ["drain:gpu-1"]
        gate.set()
        await executor.drain_in_flight(5)
    assert executor.store.intents.unfinished() == []


async def test_a_requeue_whose_safety_count_fails_on_the_store_is_driven_again_once_it_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    fake.add_job("7", ["gpu-1"], requeue=True)
    executor, audit, _ = make(fake)
    real_record = executor.store.breaker.record_all
    calls = [0]

    def record_all(*args: Any) -> None:
        calls[0] += 1
        if calls[0] == 2:  # the requeue's count (the drain's was the first)
            raise StoreError("postgresql://watchd@db/watchd: recording a disruption of gpu-1: server closed")
        real_record(*args)

    monkeypatch.setattr(executor.store.breaker, "record_all", record_all)
    async with executor:
        for decision in rule_engine().evaluate(xid_event("gpu-1")):
            executor.submit(decision, 0.0)
        await executor.drain_in_flight(5)
        assert [i.key for i in executor.store.intents.unfinished()] == ["requeue:gpu-1"]  # open, not failed
        assert executor.catch_up() == 1
        await executor.drain_in_flight(5)
    assert [(a.action, a.outcome) for a in audit.entries] == [
        ("drain", "drained"),
        ("requeue", "interrupted"),
        ("requeue", "requeued"),
    ], audit.entries
    assert fake.jobs["7"].state == "pending"
    assert executor.store.intents.unfinished() == []


async def test_a_requeue_whose_intent_could_not_be_written_is_done_once_the_store_takes_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    fake.add_job("7", ["gpu-1"], requeue=True)
    executor, audit, _ = make(fake)
    failing = _FailingWrites(monkeypatch)
    real_begin = executor.store.intents.begin
    fail_once = [True]

    def begin(key: str, *args: Any, **kw: Any) -> bool:
        failing.on = fail_once[0] and key == "requeue:gpu-1"
        fail_once[0] = fail_once[0] and not failing.on
        try:
            return real_begin(key, *args, **kw)
        finally:
            failing.on = False

    monkeypatch.setattr(executor.store.intents, "begin", begin)
    async with executor:
        for decision in rule_engine().evaluate(xid_event("gpu-1")):
            executor.submit(decision, 0.0)
        await executor.drain_in_flight(5)
        assert fake.jobs["7"].state == "running"
        executor.catch_up()
        await executor.drain_in_flight(5)
        executor.catch_up()  # nothing failed since: nothing more
        await executor.drain_in_flight(5)
    got = [(a.action, a.outcome) for a in audit.entries]
    assert got == [("drain", "drained"), ("requeue", "failed"), ("requeue", "requeued")], got
    assert audit.entries[2].detail.startswith("once the state database took writes again")
    assert fake.jobs["7"].state == "pending"
