"""The engine's state store: every call, persistence across reopen and across kill -9, and clear errors."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from watchd.actions.audit import AuditRecord
from watchd.store.connection import StoreError
from watchd.store.database import Store
from watchd.store.held import HeldAction
from watchd.store.schema import SCHEMA_VERSION


@pytest.fixture
def store() -> Iterator[Store]:
    with Store.open(":memory:") as s:
        yield s


def audit(time: float, node: str = "gpu-1", **kw: object) -> AuditRecord:
    return AuditRecord(time, "xid-79", f"e{time}", node, "drain", "enforce", "drained", **kw)  # type: ignore[arg-type]


def held_action(node: str = "gpu-1", at: float = 100.0) -> HeldAction:
    return HeldAction(
        rule="xid-79",
        kind="drain",
        node=node,
        pool="gpu",
        params={"reason": "Xid 79"},
        event={"id": "e1", "xid": 79, "evidence": ["NVRM: Xid 79"]},
        reason="breaker open: 3 nodes disrupted in 600s",
        held_at=at,
    )


def begin(s: Store, key: str = "drain:gpu-1", at: float = 100.0, cooldown_until: float | None = None) -> bool:
    return s.intents.begin(key, "drain", "gpu-1", "xid-79", "e1", {"reason": "Xid 79"}, at, cooldown_until)


# ---------------------------------------------------------------------------------------------- lifecycle


def test_open_sets_wal_normal_and_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with Store.open(path) as s:
        assert s.schema_version() == SCHEMA_VERSION
        assert s._db.live().execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert s._db.live().execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent in the file
    raw.close()


def test_migrates_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with Store.open(path) as s:
        assert s.schema_version() == SCHEMA_VERSION
        s.meta.set("k", "v")
    with Store.open(path) as s:  # a second open migrates nothing and keeps the data
        assert s.schema_version() == SCHEMA_VERSION
        assert s.meta.get("k") == "v"


def test_a_version_1_database_is_migrated_and_keeps_its_data(tmp_path: Path) -> None:
    from watchd.store.schema import MIGRATIONS

    path = tmp_path / "v1.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
    for statement in MIGRATIONS[0]:
        raw.execute(statement)
    raw.execute("INSERT INTO schema_version (version) VALUES (1)")
    raw.execute("INSERT INTO meta (key, value) VALUES ('k', 'v1')")
    raw.commit()
    raw.close()
    with Store.open(path) as s:
        assert s.schema_version() == SCHEMA_VERSION and s.meta.get("k") == "v1" and s.rule_state.load() == {}


def test_a_version_2_database_gains_the_lookup_indexes_and_keeps_its_held_actions(tmp_path: Path) -> None:
    from watchd.store.schema import MIGRATIONS

    path = tmp_path / "v2.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
    for statement in (*MIGRATIONS[0], *MIGRATIONS[1]):
        raw.execute(statement)
    raw.execute("INSERT INTO schema_version (version) VALUES (2)")
    raw.execute(
        "INSERT INTO held (rule, kind, node, pool, params, event, reason, held_at)"
        " VALUES ('r', 'drain', 'n1', 'gpu', '{}', '{}', 'breaker', 1.0)"
    )
    raw.execute("INSERT INTO disruptions (pool, node, at) VALUES ('gpu', 'n1', 1.0)")
    raw.commit()
    raw.close()
    with Store.open(path) as s:
        assert s.schema_version() == SCHEMA_VERSION
        found = s.held.find("drain", "n1")
        assert found is not None and found.node == "n1" and s.held.count() == 1
        assert s.breaker.contains("gpu", "n1", 0.0) and s.breaker.count("gpu", 0.0) == 1
        live = s._db.live()
        names = {r[0] for r in live.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"held_kind_node", "held_resolved", "disruptions_pool_node_at"} <= names
        plan = " ".join(
            str(r[-1])
            for r in live.execute(
                "EXPLAIN QUERY PLAN SELECT id FROM held WHERE status = 'held' AND kind = ? AND node = ?"
                " ORDER BY id LIMIT 1",
                ("drain", "n1"),
            )
        )
        assert "held_kind_node" in plan, plan


def test_rule_state_is_replaced_as_a_whole(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as s:
        s.rule_state.save({"a": ("fp-a", '{"last": []}'), "b": ("fp-b", "{}")}, 100.0)
        s.rule_state.save({"b": ("fp-b2", '{"x": 1}')}, 110.0)
    with Store.open(tmp_path / "s.db") as s:
        assert s.rule_state.load() == {"b": ("fp-b2", '{"x": 1}')}


def test_closed_store_raises_and_close_is_idempotent(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as s:
        pass
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.meta.get("k")


# ---------------------------------------------------------------------------------------------- errors


def test_garbage_file_is_a_store_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not sqlite" * 500)
    with pytest.raises(StoreError, match=f"^{path}: .*not a database"):
        Store.open(path)


def test_corrupt_pages_are_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    with Store.open(path) as s:
        for i in range(200):
            s.audit.append(audit(float(i), detail="x" * 500))
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xab" * (4096 - 100)  # the schema page, after the header
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=f"^{path}: .*malformed"):
        Store.open(path)


def test_corrupt_data_page_is_caught_by_check(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    with Store.open(path) as s:
        for i in range(200):
            s.audit.append(audit(float(i), detail="x" * 500))
        s.check()
    data = bytearray(path.read_bytes())
    mid = len(data) // 2 // 4096 * 4096
    data[mid : mid + 4096] = b"\xab" * 4096
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=str(path)):
        Store.open(path).check()


def test_unopenable_path_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=f"^{tmp_path}: cannot open"):
        Store.open(tmp_path)  # a directory
    missing = tmp_path / "no" / "such" / "state.db"
    with pytest.raises(StoreError, match=f"^{missing}: cannot open"):
        Store.open(missing)


def test_foreign_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE users (name TEXT)")
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="not a watchd state database"):
        Store.open(path)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    Store.open(path).close()
    raw = sqlite3.connect(path)
    raw.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION + 1,))
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="newer watchd"):
        Store.open(path)


def test_lock_held_too_long_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    with Store.open(path, busy_timeout_s=0.05) as s:
        raw = sqlite3.connect(path, isolation_level=None)
        raw.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match=f"^{path}: appending to the audit trail: .*locked"):
                s.audit.append(audit(1.0))
        finally:
            raw.execute("ROLLBACK")
            raw.close()
        s.audit.append(audit(1.0))  # the failed call left no transaction open
        assert len(s.audit.recent(10)) == 1


# ---------------------------------------------------------------------------------------------- audit


def test_audit_append_recent_and_prune(store: Store) -> None:
    rec = audit(1.0, params={"reason": "Xid 79", "xid": 79, "dry": False, "n": None, "f": 1.5})
    store.audit.append(rec)
    for t in range(2, 6):
        store.audit.append(audit(float(t), node="gpu-2" if t % 2 else "gpu-1"))
    assert store.audit.recent(10)[0] == rec  # params round-trip through JSON
    assert [r.time for r in store.audit.recent(3)] == [3.0, 4.0, 5.0]  # the latest, oldest first
    assert [r.time for r in store.audit.recent(10, node="gpu-1")] == [1.0, 2.0, 4.0]
    assert [r.time for r in store.audit.recent(1, node="gpu-2")] == [5.0]
    assert store.audit.recent(10, node="gpu-9") == []
    assert store.audit.prune(older_than=3.0) == 2
    assert [r.time for r in store.audit.recent(10)] == [3.0, 4.0, 5.0]


# ---------------------------------------------------------------------------------------------- intents


def test_begin_and_finish_action(store: Store) -> None:
    assert begin(store, at=100.0)
    assert not begin(store, at=101.0)  # in flight: refused, nothing written
    assert begin(store, key="drain:gpu-2", at=101.0)
    [first, second] = store.intents.unfinished()
    assert (first.key, first.kind, first.node, first.rule, first.event_id) == (
        "drain:gpu-1",
        "drain",
        "gpu-1",
        "xid-79",
        "e1",
    )
    assert first.params == {"reason": "Xid 79"} and first.decided_at == 100.0 and not first.finished
    assert second.key == "drain:gpu-2"
    assert store.intents.last_finished("drain:gpu-1") is None

    assert store.intents.finish("drain:gpu-1", "drained", "ok", finished_at=102.0)
    assert not store.intents.finish("drain:gpu-1", "drained", "again", finished_at=103.0)  # idempotent
    assert [i.key for i in store.intents.unfinished()] == ["drain:gpu-2"]
    [done] = store.intents.under("drain:gpu-1")
    assert (done.outcome, done.detail, done.finished_at, done.finished) == ("drained", "ok", 102.0, True)
    assert store.intents.last_finished("drain:gpu-1") == 102.0

    assert begin(store, at=104.0)  # finished and no cooldown: a new action may begin
    assert [i.decided_at for i in store.intents.under("drain:gpu-1")] == [100.0, 104.0]
    assert [i.decided_at for i in store.intents.under("drain:gpu-1", limit=1)] == [104.0]


def test_cooldown_taken_at_begin_and_lifted_at_finish(store: Store) -> None:
    assert begin(store, at=100.0, cooldown_until=700.0)
    assert store.intents.cooldown_until("drain:gpu-1") == 700.0
    store.intents.finish("drain:gpu-1", "drained", "ok", 101.0)
    assert not begin(store, at=699.0)  # within the cooldown
    assert begin(store, at=700.0)  # the cooldown ended
    store.intents.finish("drain:gpu-1", "failed", "scontrol timed out", 701.0, cooldown_until=701.0)
    assert begin(store, at=702.0)  # a failure lifted the cooldown: the next event retries


def test_prune_intents_keeps_unfinished(store: Store) -> None:
    begin(store, key="a", at=1.0)
    store.intents.finish("a", "drained", "", 2.0)
    begin(store, key="b", at=1.0)
    assert store.intents.prune(older_than=10.0) == 1
    assert store.intents.under("a") == []
    assert [i.key for i in store.intents.unfinished()] == ["b"]


def test_cooldowns(store: Store) -> None:
    assert store.intents.cooldown_until("drain:gpu-1") is None
    store.intents.set_cooldown("drain:gpu-1", 50.0)
    store.intents.set_cooldown("drain:gpu-1", 60.0)
    store.intents.set_cooldown("drain:gpu-2", 40.0)
    assert store.intents.cooldown_until("drain:gpu-1") == 60.0
    assert not begin(store, at=59.0)
    assert store.intents.prune_cooldowns(now=40.0) == 1
    assert store.intents.cooldown_until("drain:gpu-2") is None
    store.intents.clear_cooldown("drain:gpu-1")
    assert store.intents.cooldown_until("drain:gpu-1") is None
    assert begin(store, at=59.0)


# ---------------------------------------------------------------------------------------------- breaker


def test_disruptions_count_distinct_nodes(store: Store) -> None:
    store.breaker.record("gpu", "n1", 10.0)
    store.breaker.record("gpu", "n2", 20.0)
    store.breaker.record("gpu", "n1", 30.0)
    store.breaker.record("cpu", "c1", 25.0)
    assert store.breaker.since("gpu", 0.0) == [("n2", 20.0), ("n1", 30.0)]
    assert store.breaker.since("gpu", 25.0) == [("n1", 30.0)]
    assert store.breaker.since("cpu", 0.0) == [("c1", 25.0)]
    assert store.breaker.since("none", 0.0) == []
    assert store.breaker.prune(older_than=25.0) == 2
    assert store.breaker.since("gpu", 0.0) == [("n1", 30.0)]
    assert store.breaker.since("cpu", 0.0) == [("c1", 25.0)]


# ---------------------------------------------------------------------------------------------- held


def test_hold_release_discard(store: Store) -> None:
    a = store.held.hold(held_action("gpu-1", 100.0))
    b = store.held.hold(held_action("gpu-2", 101.0))
    assert a != b
    assert store.held.list() == [
        replace(held_action("gpu-1", 100.0), id=a),
        replace(held_action("gpu-2", 101.0), id=b),
    ]

    released = store.held.release(a, by="alice", at=200.0)
    assert released is not None
    assert (released.id, released.status, released.resolved_by, released.resolved_at) == (
        a,
        "released",
        "alice",
        200.0,
    )
    assert released.node == "gpu-1" and released.params == {"reason": "Xid 79"}
    assert store.held.release(a, by="bob", at=201.0) is None  # second call: no-op
    assert store.held.discard(a, by="bob", at=201.0) is None  # already resolved

    discarded = store.held.discard(b, by="bob", at=202.0)
    assert discarded is not None and discarded.status == "discarded"
    assert store.held.discard(b, by="bob", at=203.0) is None
    assert store.held.release(999, by="x", at=1.0) is None

    assert store.held.list() == []
    assert [h.id for h in store.held.list("released")] == [a]
    assert [h.id for h in store.held.list("discarded")] == [b]
    assert store.held.get(a) == store.held.list("released")[0]
    assert store.held.get(999) is None

    c = store.held.hold(held_action("gpu-3"))
    assert store.held.prune(older_than=201.0) == 1  # released at 200; held ones are never pruned
    assert [h.id for h in store.held.list()] == [c]
    assert store.held.list("discarded") != [] and store.held.list("released") == []


# ---------------------------------------------------------------------------------------------- meta


def test_meta(store: Store) -> None:
    assert store.meta.get("k") is None
    store.meta.set("k", "1")
    store.meta.set("k", "2")
    assert store.meta.get("k") == "2"
    store.meta.delete("k")
    assert store.meta.get("k") is None


# ---------------------------------------------------------------------------------------------- persistence


def test_everything_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with Store.open(path) as s:
        s.audit.append(audit(1.0, params={"reason": "r"}))
        begin(s, key="drain:gpu-1", at=1.0, cooldown_until=601.0)
        begin(s, key="drain:gpu-2", at=2.0)
        s.intents.finish("drain:gpu-2", "drained", "ok", 3.0)
        s.intents.set_cooldown("requeue:gpu-3", 900.0)
        s.breaker.record("gpu", "gpu-1", 1.0)
        held_id = s.held.hold(held_action())
        released_id = s.held.hold(held_action("gpu-2"))
        s.held.release(released_id, "alice", 5.0)
        s.meta.set("started", "yes")
    with Store.open(path) as s:
        assert s.audit.recent(10) == [audit(1.0, params={"reason": "r"})]
        assert [i.key for i in s.intents.unfinished()] == ["drain:gpu-1"]
        assert not begin(s, key="drain:gpu-1", at=10.0)  # still in flight after the restart
        assert s.intents.last_finished("drain:gpu-2") == 3.0
        assert s.intents.cooldown_until("drain:gpu-1") == 601.0
        assert s.intents.cooldown_until("requeue:gpu-3") == 900.0
        assert s.breaker.since("gpu", 0.0) == [("gpu-1", 1.0)]
        assert [h.id for h in s.held.list()] == [held_id]
        assert [h.resolved_by for h in s.held.list("released")] == ["alice"]
        assert s.meta.get("started") == "yes"
        s.check()


def test_two_stores_on_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with Store.open(path) as engine, Store.open(path) as cli:
        held_id = engine.held.hold(held_action())
        assert [h.id for h in cli.held.list()] == [held_id]
        assert cli.held.release(held_id, "alice", 10.0) is not None
        assert engine.held.release(held_id, "engine", 11.0) is None  # released once, whoever races
        assert begin(engine, key="k")
        assert not begin(cli, key="k")  # one in flight per key, across connections
        cli.audit.append(audit(1.0))
        assert len(engine.audit.recent(10)) == 1


# ---------------------------------------------------------------------------------------------- kill -9

WRITER = Path(__file__).parent.parent / "store_writer.py"


@pytest.mark.real
def test_kill_9_loses_nothing_committed(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    child = subprocess.Popen(
        [sys.executable, str(WRITER), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 20.0
        held_seen = 0
        while held_seen < 150:  # let it commit a few hundred rows of each kind
            line = child.stdout.readline()
            if not line:
                _, err = child.communicate(timeout=5)
                pytest.fail(f"writer exited early ({child.returncode}): {err}")
            assert time.monotonic() < deadline, "writer too slow"
            lines.append(line)
            held_seen += line.startswith("held ")
            if held_seen == 75:  # a second process opens and reads while the writer writes
                with Store.open(path) as reader:
                    assert len(reader.held.list()) >= 74
        os.kill(child.pid, signal.SIGKILL)  # mid-loop: it is writing flat out
        child.wait(timeout=5)
        rest = child.stdout.read()  # through our buffer, to EOF: communicate() would skip what is buffered
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    lines.extend(rest.splitlines(keepends=True))
    done = [line.split() for line in lines if line.endswith("\n")]  # a torn last line is not a report
    reported: dict[str, set[int]] = {}
    for kind, *value in done:
        if value:
            reported.setdefault(kind, set()).add(int(value[0]))

    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    raw.close()
    with Store.open(path) as s:
        s.check()
        intents = {int(k.removeprefix("drain:n")): f for k, f in _intent_keys(s).items()}
        assert reported["intent"] <= set(intents)
        assert all(intents[i] for i in reported["finished"])
        unfinished = {int(i.key.removeprefix("drain:n")) for i in s.intents.unfinished()}
        assert unfinished == {i for i, finished in intents.items() if not finished}
        assert unfinished - reported["intent"] <= {max(reported["intent"]) + 1}  # the last, maybe unreported
        audited = {int(r.event_id[1:]) for r in s.audit.recent(1_000_000)}
        assert reported["audit"] <= audited
        disrupted = {int(node[1:]) for node, _ in s.breaker.since("gpu", 0.0)}
        assert reported["disruption"] <= disrupted
        assert reported["held"] <= {h.id for h in s.held.list()}


def _intent_keys(s: Store) -> dict[str, bool]:
    rows = s._db.live().execute("SELECT key, finished_at IS NOT NULL FROM intents").fetchall()
    return {str(r[0]): bool(r[1]) for r in rows}


# ---------------------------------------------------------------- lookups that do not grow (issue 16 item 7)


def test_held_lookup_by_kind_and_node_count_and_newest_page() -> None:
    with Store.open(":memory:") as s:
        ids = [s.held.hold(held_action(f"gpu-{i}", at=100.0 + i)) for i in range(5)]
        s.held.hold(replace(held_action("gpu-1"), kind="requeue"))
        found = s.held.find("drain", "gpu-3")
        assert found is not None and found.id == ids[3]
        assert s.held.find("drain", "gpu-9") is None
        s.held.discard(ids[3], "ops", 200.0)
        assert s.held.find("drain", "gpu-3") is None  # resolved: no longer held
        assert s.held.count() == 5 and s.held.count("discarded") == 1
        assert s.held.count_by_node() == {"gpu-0": 1, "gpu-1": 2, "gpu-2": 1, "gpu-4": 1}
        assert [h.node for h in s.held.list(limit=2)] == ["gpu-4", "gpu-1"]  # the newest two, oldest first
        assert len(s.held.list()) == 5


def test_breaker_count_contains_and_newest_page() -> None:
    with Store.open(":memory:") as s:
        for node, at in (("n1", 10.0), ("n2", 20.0), ("n1", 30.0), ("n3", 40.0)):
            s.breaker.record("gpu", node, at)
        assert s.breaker.count("gpu", 0.0) == 3 and s.breaker.count("gpu", 25.0) == 2
        assert s.breaker.count("cpu", 0.0) == 0
        assert s.breaker.contains("gpu", "n2", 15.0) and not s.breaker.contains("gpu", "n2", 25.0)
        assert s.breaker.since("gpu", 0.0, limit=2) == [("n1", 30.0), ("n3", 40.0)]
        assert len(s.breaker.since("gpu", 0.0)) == s.breaker.count("gpu", 0.0)


def test_resolved_held_actions_and_finished_intents_are_pruned_past_retention() -> None:
    with Store.open(":memory:") as s:
        old, new, kept = (s.held.hold(held_action(f"gpu-{i}")) for i in range(3))
        s.held.release(old, "ops", 100.0)
        s.held.discard(new, "ops", 500.0)
        assert s.held.prune(300.0) == 1
        assert s.held.get(old) is None and s.held.get(new) is not None and s.held.get(kept) is not None
        assert begin(s, "drain:a", at=100.0) and begin(s, "drain:b", at=100.0)
        s.intents.finish("drain:a", "drained", "", 150.0)
        assert s.intents.prune(300.0) == 1
        assert [i.key for i in s.intents.unfinished()] == ["drain:b"]  # unfinished: never pruned
