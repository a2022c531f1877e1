"""The engine's durable state, in one embedded SQLite database, so that a restart (clean or ``kill -9``)
neither repeats nor forgets an action nor resets the safety breaker.

What it holds: the audit trail; the action intents (a write-ahead log of decisions: an intent is written
before the scheduler is touched and finished after, so :meth:`Store.unfinished_actions` lists exactly what a
crash interrupted); cooldowns per action key (``"drain:gpu-7"``); the breaker window (which nodes of a pool
were disrupted when); the actions held for a human; what the rules remember (count windows, ``for`` holds,
``unless`` sightings, rule cooldowns: a snapshot, saved every few seconds and at shutdown); the alerts
firing; and a small key/value ``meta`` table.

Durability: the journal is WAL with ``synchronous=NORMAL``. A committed call survives a crash of the process
(``kill -9``, OOM kill, a segfault): its pages are in the WAL file, in the kernel's cache, before the call
returns. A power loss or kernel crash may lose the last few commits (the WAL is fsynced at checkpoints, not
at each commit), but never corrupts the database.

Synchronous on the event loop, deliberately: every call is one small local transaction (an indexed insert,
update or select) that commits without an fsync, tens of microseconds, less than decoding one ingest batch.
Handing each to a thread would cost more than the call and would reorder writes. The one wait is the lock:
a second process writing the same file (the CLI releasing a held action) holds it for a millisecond or so;
``busy_timeout`` bounds the wait and a call that still cannot get the lock raises :class:`StoreError`.

Times are float seconds since the epoch, always passed in by the caller: nothing here reads a clock.
Every failure of the database (unreadable, corrupt, locked, disk full) is a :class:`StoreError` naming the
file, never a traceback from deep inside sqlite3.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from watchd.actions.audit import AuditRecord
from watchd.errors import UsageError
from watchd.model.events import Scalar

HeldStatus = Literal["held", "released", "discarded"]


class StoreError(UsageError):
    """The state database cannot be used; the message names the file and says why (printed as one line)."""


# ---------------------------------------------------------------------------------------------- schema

# Each migration takes the schema from version N-1 to N, in one transaction with the version bump.
# Append only: a released migration is never edited.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: the first schema
        """CREATE TABLE audit (
            id INTEGER PRIMARY KEY,
            time REAL NOT NULL,
            rule TEXT NOT NULL,
            event_id TEXT NOT NULL,
            node TEXT NOT NULL,
            action TEXT NOT NULL,
            mode TEXT NOT NULL,
            outcome TEXT NOT NULL,
            detail TEXT NOT NULL,
            duration_s REAL NOT NULL,
            params TEXT NOT NULL
        )""",
        "CREATE INDEX audit_time ON audit (time)",
        "CREATE INDEX audit_node ON audit (node, id)",
        """CREATE TABLE intents (
            id INTEGER PRIMARY KEY,
            key TEXT NOT NULL,
            kind TEXT NOT NULL,
            node TEXT NOT NULL,
            rule TEXT NOT NULL,
            event_id TEXT NOT NULL,
            params TEXT NOT NULL,
            decided_at REAL NOT NULL,
            finished_at REAL,
            outcome TEXT,
            detail TEXT NOT NULL DEFAULT ''
        )""",
        # At most one unfinished intent per key, enforced by the database itself.
        "CREATE UNIQUE INDEX intents_in_flight ON intents (key) WHERE finished_at IS NULL",
        "CREATE INDEX intents_key ON intents (key, id)",
        "CREATE INDEX intents_finished ON intents (finished_at)",
        "CREATE TABLE cooldowns (key TEXT PRIMARY KEY, until REAL NOT NULL) WITHOUT ROWID",
        """CREATE TABLE disruptions (
            id INTEGER PRIMARY KEY,
            pool TEXT NOT NULL,
            node TEXT NOT NULL,
            at REAL NOT NULL
        )""",
        "CREATE INDEX disruptions_pool_at ON disruptions (pool, at)",
        "CREATE INDEX disruptions_at ON disruptions (at)",
        """CREATE TABLE held (
            id INTEGER PRIMARY KEY,
            rule TEXT NOT NULL,
            kind TEXT NOT NULL,
            node TEXT NOT NULL,
            pool TEXT NOT NULL,
            params TEXT NOT NULL,
            event TEXT NOT NULL,
            reason TEXT NOT NULL,
            held_at REAL NOT NULL,
            status TEXT NOT NULL DEFAULT 'held' CHECK (status IN ('held', 'released', 'discarded')),
            resolved_by TEXT NOT NULL DEFAULT '',
            resolved_at REAL
        )""",
        "CREATE INDEX held_status ON held (status, id)",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    ),
    (  # 2: what the rules remember (windows, holds, sightings, cooldowns), one JSON document per rule
        """CREATE TABLE rule_state (
            rule TEXT PRIMARY KEY,
            fingerprint TEXT NOT NULL,
            state TEXT NOT NULL,
            saved_at REAL NOT NULL
        ) WITHOUT ROWID""",
        # the alerts watchd has firing, so a restart re-fires them instead of letting the pages expire
        """CREATE TABLE firing_alerts (
            key TEXT PRIMARY KEY,
            alert TEXT NOT NULL,
            resolve_at REAL NOT NULL
        ) WITHOUT ROWID""",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)

DEFAULT_BUSY_TIMEOUT_S = 5.0


# ---------------------------------------------------------------------------------------------- rows


@dataclass(frozen=True, slots=True)
class Intent:
    """One decided action: written before the scheduler is touched, finished after."""

    id: int
    key: str
    kind: str
    node: str
    rule: str
    event_id: str
    params: dict[str, Scalar]
    decided_at: float
    finished_at: float | None = None
    outcome: str | None = None
    detail: str = ""

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


@dataclass(frozen=True, slots=True)
class HeldAction:
    """An action the engine decided but did not take (the breaker was open, or policy asks a human).

    ``id``, ``status``, ``resolved_by`` and ``resolved_at`` are set by the store; :meth:`Store.hold` ignores
    them. ``event`` is the event's summary and evidence, anything JSON can hold."""

    rule: str
    kind: str
    node: str
    pool: str
    params: dict[str, Scalar]
    event: dict[str, Any]
    reason: str
    held_at: float
    id: int = 0
    status: HeldStatus = "held"
    resolved_by: str = ""
    resolved_at: float | None = None


_HELD_COLS = "id, rule, kind, node, pool, params, event, reason, held_at, status, resolved_by, resolved_at"
_INTENT_COLS = "id, key, kind, node, rule, event_id, params, decided_at, finished_at, outcome, detail"
_AUDIT_COLS = "time, rule, event_id, node, action, mode, outcome, detail, duration_s, params"


def _dump(value: Mapping[str, Any]) -> str:
    return json.dumps(dict(value), sort_keys=True, separators=(",", ":"))


def _intent(row: sqlite3.Row) -> Intent:
    return Intent(
        id=row["id"],
        key=row["key"],
        kind=row["kind"],
        node=row["node"],
        rule=row["rule"],
        event_id=row["event_id"],
        params=json.loads(row["params"]),
        decided_at=row["decided_at"],
        finished_at=row["finished_at"],
        outcome=row["outcome"],
        detail=row["detail"],
    )


def _held(row: sqlite3.Row) -> HeldAction:
    return HeldAction(
        id=row["id"],
        rule=row["rule"],
        kind=row["kind"],
        node=row["node"],
        pool=row["pool"],
        params=json.loads(row["params"]),
        event=json.loads(row["event"]),
        reason=row["reason"],
        held_at=row["held_at"],
        status=row["status"],
        resolved_by=row["resolved_by"],
        resolved_at=row["resolved_at"],
    )


def _audit(row: sqlite3.Row) -> AuditRecord:
    return AuditRecord(
        time=row["time"],
        rule=row["rule"],
        event_id=row["event_id"],
        node=row["node"],
        action=row["action"],
        mode=row["mode"],
        outcome=row["outcome"],
        detail=row["detail"],
        duration_s=row["duration_s"],
        params=json.loads(row["params"]),
    )


# ---------------------------------------------------------------------------------------------- store


class Store:
    """The state database. Open with :meth:`open`; one instance per thread (sqlite3's rule)."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn: sqlite3.Connection | None = conn
        self.path = path

    # ------------------------------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, path: Path | str, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Store:
        """Open (creating it if needed) and migrate the database at ``path``; ``":memory:"`` for tests.

        Raises StoreError naming ``path`` when the file cannot be opened, is not a database, is corrupt,
        belongs to something else or was written by a newer watchd."""
        name = str(path)
        try:
            conn = sqlite3.connect(name, isolation_level=None, timeout=busy_timeout_s)
        except sqlite3.Error as exc:
            raise StoreError(f"{name}: cannot open the state database: {exc}") from None
        conn.row_factory = sqlite3.Row
        store = cls(conn, name)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            store._migrate()
        except sqlite3.Error as exc:
            conn.close()
            raise store._error("cannot open the state database", exc) from None
        except StoreError:
            conn.close()
            raise
        return store

    def close(self) -> None:
        """Close the database; idempotent. Later calls raise StoreError."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA optimize")
            conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema_version(self) -> int:
        row = self._one("reading the schema version", "SELECT MAX(version) FROM schema_version")
        return int(row[0]) if row is not None and row[0] is not None else 0

    def check(self) -> None:
        """Run SQLite's full integrity check (reads the whole file); raises StoreError listing problems."""
        rows = self._all("checking integrity", "PRAGMA integrity_check")
        problems = [str(r[0]) for r in rows]
        if problems != ["ok"]:
            raise StoreError(f"{self.path}: the state database is corrupt: {'; '.join(problems[:5])}")

    def _migrate(self) -> None:
        conn = self._live()
        conn.execute("BEGIN IMMEDIATE")  # one migrator at a time, across processes
        try:
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
            }
            if tables and "schema_version" not in tables:
                raise StoreError(
                    f"{self.path}: not a watchd state database (it holds tables {sorted(tables)[:5]})"
                )
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY)")
            row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            current = int(row[0]) if row[0] is not None else 0
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: written by a newer watchd (schema version {current}; "
                    f"this one knows up to {SCHEMA_VERSION})"
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version - 1]:
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------------------------ plumbing

    def _live(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self.path}: the state database is closed")
        return self._conn

    def _error(self, doing: str, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"{self.path}: {doing}: {exc}")

    @contextlib.contextmanager
    def _write(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One write transaction. IMMEDIATE takes the write lock up front, so a read-then-write can never
        fail half-way on a lock upgrade, and busy_timeout applies."""
        conn = self._live()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._error(doing, exc) from None

    def _one(self, doing: str, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Row | None:
        try:
            row: sqlite3.Row | None = self._live().execute(sql, args).fetchone()
        except sqlite3.Error as exc:
            raise self._error(doing, exc) from None
        return row

    def _all(self, doing: str, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        try:
            return self._live().execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise self._error(doing, exc) from None

    def _delete(self, doing: str, sql: str, args: tuple[Any, ...]) -> int:
        with self._write(doing) as conn:
            return conn.execute(sql, args).rowcount

    # ------------------------------------------------------------------------------------ audit

    def append_audit(self, rec: AuditRecord) -> int:
        """Append one audit record; returns its row id."""
        with self._write("appending to the audit trail") as conn:
            cur = conn.execute(
                f"INSERT INTO audit ({_AUDIT_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    rec.time,
                    rec.rule,
                    rec.event_id,
                    rec.node,
                    rec.action,
                    rec.mode,
                    rec.outcome,
                    rec.detail,
                    rec.duration_s,
                    _dump(rec.params),
                ),
            )
            return int(cur.lastrowid or 0)

    def recent_audit(self, limit: int = 100, node: str | None = None) -> list[AuditRecord]:
        """The last ``limit`` records (of ``node`` when given), oldest first."""
        if node is None:
            rows = self._all(
                "reading the audit trail",
                f"SELECT {_AUDIT_COLS} FROM audit ORDER BY id DESC LIMIT ?",
                (limit,),
            )
        else:
            rows = self._all(
                "reading the audit trail",
                f"SELECT {_AUDIT_COLS} FROM audit WHERE node = ? ORDER BY id DESC LIMIT ?",
                (node, limit),
            )
        return [_audit(r) for r in reversed(rows)]

    def prune_audit(self, older_than: float) -> int:
        """Delete audit records with ``time < older_than``; returns how many."""
        return self._delete("pruning the audit trail", "DELETE FROM audit WHERE time < ?", (older_than,))

    # ------------------------------------------------------------------------------------ intents

    def begin_action(
        self,
        key: str,
        kind: str,
        node: str,
        rule: str,
        event_id: str,
        params: Mapping[str, Scalar],
        decided_at: float,
        cooldown_until: float | None = None,
    ) -> bool:
        """Record the decision to act under ``key`` before acting: True when it is recorded and the caller
        should act; False (nothing written) when an action with this key is in flight or the key is in its
        cooldown at ``decided_at``. ``cooldown_until``, when given, starts the key's cooldown in the same
        transaction."""
        with self._write(f"recording the intent {key}") as conn:
            if conn.execute("SELECT 1 FROM intents WHERE key = ? AND finished_at IS NULL", (key,)).fetchone():
                return False
            row = conn.execute("SELECT until FROM cooldowns WHERE key = ?", (key,)).fetchone()
            if row is not None and row[0] > decided_at:
                return False
            conn.execute(
                "INSERT INTO intents (key, kind, node, rule, event_id, params, decided_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, kind, node, rule, event_id, _dump(params), decided_at),
            )
            if cooldown_until is not None:
                _set_cooldown(conn, key, cooldown_until)
            return True

    def finish_action(
        self,
        key: str,
        outcome: str,
        detail: str,
        finished_at: float,
        cooldown_until: float | None = None,
    ) -> bool:
        """Mark the in-flight action under ``key`` done. False when none is in flight (already finished:
        finishing twice is harmless). ``cooldown_until``, when given, sets the key's cooldown in the same
        transaction; a time at or before ``finished_at`` lifts it (after a failure, to let the next event
        retry)."""
        with self._write(f"finishing the intent {key}") as conn:
            cur = conn.execute(
                "UPDATE intents SET finished_at = ?, outcome = ?, detail = ?"
                " WHERE key = ? AND finished_at IS NULL",
                (finished_at, outcome, detail, key),
            )
            if cur.rowcount == 0:
                return False
            if cooldown_until is not None:
                _set_cooldown(conn, key, cooldown_until)
            return True

    def unfinished_actions(self) -> list[Intent]:
        """Decided but not finished, oldest first: after a crash, each must be driven again, once."""
        rows = self._all(
            "reading unfinished intents",
            f"SELECT {_INTENT_COLS} FROM intents WHERE finished_at IS NULL ORDER BY id",
        )
        return [_intent(r) for r in rows]

    def intents(self, key: str, limit: int = 100) -> list[Intent]:
        """The last ``limit`` intents under ``key``, finished or not, oldest first."""
        rows = self._all(
            "reading intents",
            f"SELECT {_INTENT_COLS} FROM intents WHERE key = ? ORDER BY id DESC LIMIT ?",
            (key, limit),
        )
        return [_intent(r) for r in reversed(rows)]

    def intents_since(self, kind: str, since: float) -> list[Intent]:
        """Every intent of ``kind`` decided at or after ``since``, oldest first."""
        rows = self._all(
            "reading intents",
            f"SELECT {_INTENT_COLS} FROM intents WHERE kind = ? AND decided_at >= ? ORDER BY id",
            (kind, since),
        )
        return [_intent(r) for r in rows]

    def last_action(self, key: str) -> float | None:
        """When the last finished action under ``key`` finished; None if none has."""
        row = self._one(
            "reading intents",
            "SELECT MAX(finished_at) FROM intents WHERE key = ? AND finished_at IS NOT NULL",
            (key,),
        )
        return None if row is None or row[0] is None else float(row[0])

    def prune_intents(self, older_than: float) -> int:
        """Delete finished intents with ``finished_at < older_than`` (unfinished ones are never pruned)."""
        return self._delete(
            "pruning intents",
            "DELETE FROM intents WHERE finished_at IS NOT NULL AND finished_at < ?",
            (older_than,),
        )

    # ------------------------------------------------------------------------------------ cooldowns

    def set_cooldown(self, key: str, until: float) -> None:
        with self._write(f"setting the cooldown of {key}") as conn:
            _set_cooldown(conn, key, until)

    def clear_cooldown(self, key: str) -> None:
        self._delete(f"clearing the cooldown of {key}", "DELETE FROM cooldowns WHERE key = ?", (key,))

    def cooldown_until(self, key: str) -> float | None:
        """The end of ``key``'s cooldown as stored (it may be in the past); None when it has none."""
        row = self._one("reading cooldowns", "SELECT until FROM cooldowns WHERE key = ?", (key,))
        return None if row is None else float(row[0])

    def prune_cooldowns(self, now: float) -> int:
        """Delete cooldowns that ended at or before ``now``."""
        return self._delete("pruning cooldowns", "DELETE FROM cooldowns WHERE until <= ?", (now,))

    # ------------------------------------------------------------------------------------ rule state

    def save_rule_state(self, states: Mapping[str, tuple[str, str]], saved_at: float) -> None:
        """Replace the saved rule state with ``states`` (rule -> (fingerprint, JSON)), in one transaction:
        a crash leaves the previous snapshot or this one, never a mix."""
        rows = [(rule, fp, text, saved_at) for rule, (fp, text) in states.items()]
        with self._write("saving the rule state") as conn:
            conn.execute("DELETE FROM rule_state")
            conn.executemany(
                "INSERT INTO rule_state (rule, fingerprint, state, saved_at) VALUES (?, ?, ?, ?)", rows
            )

    def rule_state(self) -> dict[str, tuple[str, str]]:
        """The saved rule state: rule -> (fingerprint, JSON)."""
        rows = self._all("reading the rule state", "SELECT rule, fingerprint, state FROM rule_state")
        return {str(r[0]): (str(r[1]), str(r[2])) for r in rows}

    # ------------------------------------------------------------------------------------ firing alerts

    def set_firing_alert(self, key: str, alert: Mapping[str, Any], resolve_at: float) -> None:
        with self._write(f"recording the firing alert {key}") as conn:
            conn.execute(
                "INSERT INTO firing_alerts (key, alert, resolve_at) VALUES (?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET alert = excluded.alert, resolve_at = excluded.resolve_at",
                (key, _dump(alert), resolve_at),
            )

    def clear_firing_alert(self, key: str) -> None:
        self._delete(f"clearing the firing alert {key}", "DELETE FROM firing_alerts WHERE key = ?", (key,))

    def firing_alerts(self) -> list[tuple[str, dict[str, Any], float]]:
        """(key, alert as recorded, when it is to resolve), oldest resolution first."""
        rows = self._all(
            "reading the firing alerts",
            "SELECT key, alert, resolve_at FROM firing_alerts ORDER BY resolve_at",
        )
        return [(str(r[0]), json.loads(r[1]), float(r[2])) for r in rows]

    # ------------------------------------------------------------------------------------ breaker window

    def record_disruption(self, pool: str, node: str, at: float) -> None:
        with self._write(f"recording a disruption of {node}") as conn:
            conn.execute("INSERT INTO disruptions (pool, node, at) VALUES (?, ?, ?)", (pool, node, at))

    def forget_disruption(self, pool: str, node: str, at: float) -> None:
        """Take back a disruption counted in advance (the action then failed or changed nothing)."""
        with self._write(f"forgetting a disruption of {node}") as conn:
            conn.execute("DELETE FROM disruptions WHERE pool = ? AND node = ? AND at = ?", (pool, node, at))

    def disruptions_since(self, pool: str, since: float) -> list[tuple[str, float]]:
        """The distinct nodes of ``pool`` disrupted at or after ``since``, each with its latest disruption,
        oldest first: ``len()`` of it is what a breaker counts."""
        rows = self._all(
            "reading the breaker window",
            "SELECT node, MAX(at) AS last FROM disruptions WHERE pool = ? AND at >= ?"
            " GROUP BY node ORDER BY last, node",
            (pool, since),
        )
        return [(str(r[0]), float(r[1])) for r in rows]

    def prune_disruptions(self, older_than: float) -> int:
        return self._delete(
            "pruning the breaker window", "DELETE FROM disruptions WHERE at < ?", (older_than,)
        )

    # ------------------------------------------------------------------------------------ held actions

    def hold(self, action: HeldAction) -> int:
        """Store an action held for a human; returns its id (``action.id`` and ``status`` are ignored)."""
        with self._write(f"holding a {action.kind} of {action.node}") as conn:
            cur = conn.execute(
                "INSERT INTO held (rule, kind, node, pool, params, event, reason, held_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    action.rule,
                    action.kind,
                    action.node,
                    action.pool,
                    _dump(action.params),
                    _dump(action.event),
                    action.reason,
                    action.held_at,
                ),
            )
            return int(cur.lastrowid or 0)

    def held(self, status: HeldStatus = "held") -> list[HeldAction]:
        """Held actions with ``status``, oldest first."""
        rows = self._all(
            "reading held actions",
            f"SELECT {_HELD_COLS} FROM held WHERE status = ? ORDER BY id",
            (status,),
        )
        return [_held(r) for r in rows]

    def get_held(self, id: int) -> HeldAction | None:
        row = self._one("reading a held action", f"SELECT {_HELD_COLS} FROM held WHERE id = ?", (id,))
        return None if row is None else _held(row)

    def release(self, id: int, by: str, at: float) -> HeldAction | None:
        """Mark held action ``id`` released by ``by`` at ``at`` and return it (the caller then carries it
        out). None when it is not held (unknown, or already released or discarded): a second call is a
        no-op, so one held action is released at most once, even by two processes racing."""
        return self._resolve(id, "released", by, at)

    def discard(self, id: int, by: str, at: float) -> HeldAction | None:
        """Mark held action ``id`` discarded; None when it is not held (see :meth:`release`)."""
        return self._resolve(id, "discarded", by, at)

    def prune_held(self, older_than: float) -> int:
        """Delete released and discarded actions resolved before ``older_than`` (held ones stay)."""
        return self._delete(
            "pruning held actions",
            "DELETE FROM held WHERE status != 'held' AND resolved_at < ?",
            (older_than,),
        )

    def _resolve(self, id: int, status: HeldStatus, by: str, at: float) -> HeldAction | None:
        with self._write(f"marking held action {id} {status}") as conn:
            cur = conn.execute(
                "UPDATE held SET status = ?, resolved_by = ?, resolved_at = ?"
                " WHERE id = ? AND status = 'held'",
                (status, by, at, id),
            )
            if cur.rowcount == 0:
                return None
            row = conn.execute(f"SELECT {_HELD_COLS} FROM held WHERE id = ?", (id,)).fetchone()
            return _held(row)

    # ------------------------------------------------------------------------------------ meta

    def set_meta(self, key: str, value: str) -> None:
        with self._write(f"setting meta {key}") as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def get_meta(self, key: str) -> str | None:
        row = self._one("reading meta", "SELECT value FROM meta WHERE key = ?", (key,))
        return None if row is None else str(row[0])

    def delete_meta(self, key: str) -> None:
        self._delete(f"deleting meta {key}", "DELETE FROM meta WHERE key = ?", (key,))


def _set_cooldown(conn: sqlite3.Connection, key: str, until: float) -> None:
    conn.execute(
        "INSERT INTO cooldowns (key, until) VALUES (?, ?)"
        " ON CONFLICT (key) DO UPDATE SET until = excluded.until",
        (key, until),
    )
