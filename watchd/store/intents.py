"""Action intents, a write-ahead log of decisions, and the cooldowns per action key.

An intent is written before the scheduler is touched and finished after, so :meth:`Intents.unfinished`
lists exactly what a crash interrupted.

In flight: the keys this process has begun (or adopted, to re-drive them after a crash) and not yet finished.
An unfinished intent this process began or adopted and is no longer driving is stale: its finish could not be
written (the disk was full, the database locked or gone) or its action was cancelled or interrupted. It must
never block its key. A finish that could not be written is kept here (its outcome is known) and written by
:meth:`Intents.write_unwritten` once the database takes writes again, or by the next :meth:`Intents.begin`
under its key (whose cooldown then applies as after any finish). Any other stale intent is closed by the next
begin under its key (outcome ``abandoned``), which records the new decision whatever the cooldown its begin
set. An unfinished intent of another process (a previous incarnation, before recovery adopts it; another
connection) still holds its key."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from watchd.model.events import Scalar
from watchd.store.connection import Connection, Row, StoreError, Tx, dump, text

#: the outcome given to a stale unfinished intent when a new decision under its key replaces it
ABANDONED = "abandoned"
#: the outcome of a decision de-duplicated by an intent (its audit record is not that intent's)
DEDUPLICATED = "deduplicated"
#: the outcome of an attempt that left its intent open: driven again, the action is audited once more when
#: it finishes, and that later record is the finished intent's
INTERRUPTED = "interrupted"

_COLS = "id, key, kind, node, rule, event_id, params, decided_at, finished_at, outcome, detail, result"


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
    #: what the action left, as data (its ActionResult's ``data``)
    result: Mapping[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


class Intents:
    def __init__(self, db: Connection) -> None:
        self._db = db
        self._in_flight: set[str] = set()  # keys begun or adopted by this process, not yet finished
        self._stale: set[str] = set()  # keys this process drove whose intent may be left unfinished
        self._unwritten: dict[str, _Finish] = {}  # stale keys whose finish is known but was not written

    def in_flight(self, key: str) -> bool:
        """Whether this process is driving the action under ``key`` now."""
        return text(key) in self._in_flight

    def adopt(self, key: str) -> None:
        """This process drives the unfinished intent under ``key`` (recovery re-drives it)."""
        self._in_flight.add(text(key))

    def forget(self, key: str) -> None:
        """This process no longer drives ``key`` (cancelled): its unfinished intent, if any, is stale."""
        key = text(key)
        self._in_flight.discard(key)
        self._stale.add(key)

    def begin(
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
        transaction. An unfinished intent under ``key`` that this process drove and no longer drives is
        stale: it is closed as ``abandoned`` and replaced (the cooldown its own begin set does not count)."""
        key = text(key)
        unwritten = self._unwritten.get(key)
        with self._db.write(f"recording the intent {key}") as conn:
            stale = conn.execute(
                "SELECT id FROM intents WHERE key = ? AND finished_at IS NULL", (key,)
            ).fetchone()
            if stale is not None and (key in self._in_flight or key not in self._stale):
                return False  # in flight: here, or in another process
            if stale is not None and unwritten is not None:  # done, its outcome known: finished as it was
                unwritten.write(conn, key)
                stale = None
            if stale is not None:
                conn.execute(
                    "UPDATE intents SET finished_at = ?, outcome = ?, detail = ? WHERE id = ?",
                    (decided_at, ABANDONED, "never finished; replaced by a later decision", stale[0]),
                )
                begun = True
            else:
                row = conn.execute("SELECT until FROM cooldowns WHERE key = ?", (key,)).fetchone()
                begun = row is None or row[0] <= decided_at
            if begun:
                conn.execute(
                    "INSERT INTO intents (key, kind, node, rule, event_id, params, decided_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (key, text(kind), text(node), text(rule), text(event_id), dump(params), decided_at),
                )
                if cooldown_until is not None:
                    _set_cooldown(conn, key, cooldown_until)
        if unwritten is not None:
            self._unwritten.pop(key, None)
            self._stale.discard(key)
        if not begun:
            return False
        self._in_flight.add(key)
        self._stale.discard(key)
        return True

    def finish(
        self,
        key: str,
        outcome: str,
        detail: str,
        finished_at: float,
        cooldown_until: float | None = None,
        result: Mapping[str, Any] | None = None,
    ) -> bool:
        """Mark the in-flight action under ``key`` done. False when none is in flight (already finished:
        finishing twice is harmless). ``cooldown_until``, when given, sets the key's cooldown in the same
        transaction; a time at or before ``finished_at`` lifts it (after a failure, to let the next event
        retry). Whether or not the write succeeds, the key is no longer in flight here: a finish that could
        not be written is kept (the intent is stale) and written later (:meth:`write_unwritten`, or the next
        :meth:`begin` under its key)."""
        key = text(key)
        driven = key in self._in_flight
        self._in_flight.discard(key)
        done = _Finish(
            text(str(outcome)), text(detail), finished_at, cooldown_until, dump(dict(result or {}))
        )
        try:
            with self._db.write(f"finishing the intent {key}") as conn:
                written = done.write(conn, key)
            self._stale.discard(key)
            self._unwritten.pop(key, None)
            return written
        except StoreError:
            if driven:
                self._stale.add(key)
                self._unwritten[key] = done
            raise

    def write_unwritten(self) -> int:
        """Write the finishes that could not be written (kept by :meth:`finish`), oldest first; how many. A
        StoreError stops it (what is left is kept for the next call)."""
        written = 0
        for key, done in list(self._unwritten.items()):
            if key in self._in_flight or key not in self._stale:
                self._unwritten.pop(key, None)  # begun again since (a restart's recovery adopted it)
                continue
            with self._db.write(f"finishing the intent {key}") as conn:
                done.write(conn, key)
            self._unwritten.pop(key, None)
            self._stale.discard(key)
            written += 1
        return written

    def unwritten(self) -> int:
        """How many finishes wait to be written."""
        return len(self._unwritten)

    def unfinished(self) -> list[Intent]:
        """Decided but not finished, oldest first: after a crash, each must be driven again, once."""
        rows = self._db.all(
            "reading unfinished intents", f"SELECT {_COLS} FROM intents WHERE finished_at IS NULL ORDER BY id"
        )
        return [_intent(r) for r in rows]

    def stale(self) -> list[Intent]:
        """The unfinished intents this process drove and no longer drives, whose outcome is not known (their
        action was cancelled or interrupted), oldest first: to be driven again. Those whose finish could not
        be written are not among them (:meth:`write_unwritten`)."""
        if not self._stale.difference(self._unwritten):
            return []
        return [
            i
            for i in self.unfinished()
            if i.key in self._stale and i.key not in self._in_flight and i.key not in self._unwritten
        ]

    def unaudited(self, since: float) -> list[Intent]:
        """Intents finished at or after ``since`` (not abandoned) that have no audit record: of their node and
        action (or, for an operator's release of a held action, its event), under their event id or their
        key (a re-driven action is audited under its key), written since they were decided, and not the
        record of a re-sent event's de-duplicated decision (it begins no intent) nor that of an attempt
        interrupted before the re-drive that finished it. After a crash between the
        finish and the audit, or an audit record the store failed to write, oldest first."""
        rows = self._db.all(
            "reading unaudited intents",
            f"SELECT {_COLS} FROM intents i WHERE finished_at IS NOT NULL AND finished_at >= ?"
            " AND outcome != ? AND NOT EXISTS (SELECT 1 FROM audit a WHERE a.node = i.node"
            " AND (a.action = i.kind OR a.event_id LIKE 'held-%')"
            " AND a.event_id IN (i.event_id, i.key) AND a.time >= i.decided_at AND a.outcome NOT IN (?, ?))"
            " ORDER BY id",
            (since, ABANDONED, DEDUPLICATED, INTERRUPTED),
        )
        return [_intent(r) for r in rows]

    def under(self, key: str, limit: int = 100) -> list[Intent]:
        """The last ``limit`` intents under ``key``, finished or not, oldest first."""
        rows = self._db.all(
            "reading intents",
            f"SELECT {_COLS} FROM intents WHERE key = ? ORDER BY id DESC LIMIT ?",
            (text(key), limit),
        )
        return [_intent(r) for r in reversed(rows)]

    def since(self, kind: str, since: float) -> list[Intent]:
        """Every intent of ``kind`` decided at or after ``since``, oldest first."""
        rows = self._db.all(
            "reading intents",
            f"SELECT {_COLS} FROM intents WHERE kind = ? AND decided_at >= ? ORDER BY id",
            (kind, since),
        )
        return [_intent(r) for r in rows]

    def last_finished(self, key: str) -> float | None:
        """When the last finished action under ``key`` finished; None if none has."""
        row = self._db.one(
            "reading intents",
            "SELECT MAX(finished_at) FROM intents WHERE key = ? AND finished_at IS NOT NULL",
            (text(key),),
        )
        return None if row is None or row[0] is None else float(row[0])

    def prune(self, older_than: float) -> int:
        """Delete finished intents with ``finished_at < older_than`` (unfinished ones are never pruned)."""
        return self._db.delete(
            "pruning intents",
            "DELETE FROM intents WHERE finished_at IS NOT NULL AND finished_at < ?",
            (older_than,),
        )

    # cooldowns: begin and finish set them in the same transaction as the intent

    def set_cooldown(self, key: str, until: float) -> None:
        with self._db.write(f"setting the cooldown of {key}") as conn:
            _set_cooldown(conn, text(key), until)

    def clear_cooldown(self, key: str) -> None:
        self._db.delete(
            f"clearing the cooldown of {key}", "DELETE FROM cooldowns WHERE key = ?", (text(key),)
        )

    def cooldown_until(self, key: str) -> float | None:
        """The end of ``key``'s cooldown as stored (it may be in the past); None when it has none."""
        row = self._db.one("reading cooldowns", "SELECT until FROM cooldowns WHERE key = ?", (text(key),))
        return None if row is None else float(row[0])

    def prune_cooldowns(self, now: float) -> int:
        """Delete cooldowns that ended at or before ``now``."""
        return self._db.delete("pruning cooldowns", "DELETE FROM cooldowns WHERE until <= ?", (now,))


@dataclass(frozen=True, slots=True)
class _Finish:
    """A finish as :meth:`Intents.finish` writes it (kept when it could not be)."""

    outcome: str
    detail: str
    finished_at: float
    cooldown_until: float | None
    result: str  # JSON

    def write(self, conn: Tx, key: str) -> bool:
        cur = conn.execute(
            "UPDATE intents SET finished_at = ?, outcome = ?, detail = ?, result = ?"
            " WHERE key = ? AND finished_at IS NULL",
            (self.finished_at, self.outcome, self.detail, self.result, key),
        )
        if cur.rowcount == 0:
            return False
        if self.cooldown_until is not None:
            _set_cooldown(conn, key, self.cooldown_until)
        return True


def _set_cooldown(conn: Tx, key: str, until: float) -> None:
    conn.execute(
        "INSERT INTO cooldowns (key, until) VALUES (?, ?)"
        " ON CONFLICT (key) DO UPDATE SET until = excluded.until",
        (key, until),
    )


def _intent(row: Row) -> Intent:
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
        result=json.loads(row["result"]),
    )
