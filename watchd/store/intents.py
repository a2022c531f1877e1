"""Action intents, a write-ahead log of decisions, and the cooldowns per action key.

An intent is written before the scheduler is touched and finished after, so :meth:`Intents.unfinished`
lists exactly what a crash interrupted."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

from watchd.model.events import Scalar
from watchd.store.connection import Connection, dump

_COLS = "id, key, kind, node, rule, event_id, params, decided_at, finished_at, outcome, detail"


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


class Intents:
    def __init__(self, db: Connection) -> None:
        self._db = db

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
        transaction."""
        with self._db.write(f"recording the intent {key}") as conn:
            if conn.execute("SELECT 1 FROM intents WHERE key = ? AND finished_at IS NULL", (key,)).fetchone():
                return False
            row = conn.execute("SELECT until FROM cooldowns WHERE key = ?", (key,)).fetchone()
            if row is not None and row[0] > decided_at:
                return False
            conn.execute(
                "INSERT INTO intents (key, kind, node, rule, event_id, params, decided_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, kind, node, rule, event_id, dump(params), decided_at),
            )
            if cooldown_until is not None:
                _set_cooldown(conn, key, cooldown_until)
            return True

    def finish(
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
        with self._db.write(f"finishing the intent {key}") as conn:
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

    def unfinished(self) -> list[Intent]:
        """Decided but not finished, oldest first: after a crash, each must be driven again, once."""
        rows = self._db.all(
            "reading unfinished intents", f"SELECT {_COLS} FROM intents WHERE finished_at IS NULL ORDER BY id"
        )
        return [_intent(r) for r in rows]

    def under(self, key: str, limit: int = 100) -> list[Intent]:
        """The last ``limit`` intents under ``key``, finished or not, oldest first."""
        rows = self._db.all(
            "reading intents",
            f"SELECT {_COLS} FROM intents WHERE key = ? ORDER BY id DESC LIMIT ?",
            (key, limit),
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
            (key,),
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
            _set_cooldown(conn, key, until)

    def clear_cooldown(self, key: str) -> None:
        self._db.delete(f"clearing the cooldown of {key}", "DELETE FROM cooldowns WHERE key = ?", (key,))

    def cooldown_until(self, key: str) -> float | None:
        """The end of ``key``'s cooldown as stored (it may be in the past); None when it has none."""
        row = self._db.one("reading cooldowns", "SELECT until FROM cooldowns WHERE key = ?", (key,))
        return None if row is None else float(row[0])

    def prune_cooldowns(self, now: float) -> int:
        """Delete cooldowns that ended at or before ``now``."""
        return self._db.delete("pruning cooldowns", "DELETE FROM cooldowns WHERE until <= ?", (now,))


def _set_cooldown(conn: sqlite3.Connection, key: str, until: float) -> None:
    conn.execute(
        "INSERT INTO cooldowns (key, until) VALUES (?, ?)"
        " ON CONFLICT (key) DO UPDATE SET until = excluded.until",
        (key, until),
    )


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
