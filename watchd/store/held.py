"""Actions held for a human (the breaker was open, or policy asks one), and their release or discard."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from watchd.model.events import Scalar
from watchd.store.connection import Connection, Row, dump

HeldStatus = Literal["held", "released", "discarded"]

_COLS = "id, rule, kind, node, pool, params, event, reason, held_at, status, resolved_by, resolved_at"


@dataclass(frozen=True, slots=True)
class HeldAction:
    """An action the engine decided but did not take (the breaker was open, or policy asks a human).

    ``id``, ``status``, ``resolved_by`` and ``resolved_at`` are set by the store; :meth:`HeldActions.hold`
    ignores them. ``event`` is the event's summary and evidence, anything JSON can hold."""

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


class HeldReleased(NamedTuple):
    """News to the engine's subsystems (:mod:`watchd.subsystem`): an operator released ``held``, a drain the
    breaker held, and it ended ``outcome`` at ``time`` in ``mode``."""

    held: HeldAction
    outcome: str
    time: float
    mode: str


class HeldActions:
    def __init__(self, db: Connection) -> None:
        self._db = db

    def hold(self, action: HeldAction) -> int:
        """Store an action held for a human; returns its id (``action.id`` and ``status`` are ignored)."""
        with self._db.write(f"holding a {action.kind} of {action.node}") as conn:
            cur = conn.execute(
                "INSERT INTO held (rule, kind, node, pool, params, event, reason, held_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    action.rule,
                    action.kind,
                    action.node,
                    action.pool,
                    dump(action.params),
                    dump(action.event),
                    action.reason,
                    action.held_at,
                ),
            )
            return int(cur.lastrowid or 0)

    def list(self, status: HeldStatus = "held", limit: int | None = None) -> list[HeldAction]:
        """Held actions with ``status``, oldest first; with ``limit``, only the newest ``limit`` of them."""
        if limit is None:
            rows = self._db.all(
                "reading held actions", f"SELECT {_COLS} FROM held WHERE status = ? ORDER BY id", (status,)
            )
        else:
            rows = self._db.all(
                "reading held actions",
                f"SELECT {_COLS} FROM held WHERE status = ? ORDER BY id DESC LIMIT ?",
                (status, limit),
            )[::-1]
        return [_held(r) for r in rows]

    def find(self, kind: str, node: str) -> HeldAction | None:
        """The oldest action of ``kind`` on ``node`` still held; None when none is (one indexed lookup)."""
        row = self._db.one(
            "reading a held action",
            f"SELECT {_COLS} FROM held WHERE status = 'held' AND kind = ? AND node = ? ORDER BY id LIMIT 1",
            (kind, node),
        )
        return None if row is None else _held(row)

    def count(self, status: HeldStatus = "held") -> int:
        row = self._db.one("counting held actions", "SELECT count(*) FROM held WHERE status = ?", (status,))
        return 0 if row is None else int(row[0])

    def count_by_node(self) -> dict[str, int]:
        """Per node, how many actions are held on it (nodes with none are absent)."""
        rows = self._db.all(
            "counting held actions",
            "SELECT node, count(*) FROM held WHERE status = 'held' GROUP BY node",
        )
        return {str(r[0]): int(r[1]) for r in rows}

    def get(self, id: int) -> HeldAction | None:
        row = self._db.one("reading a held action", f"SELECT {_COLS} FROM held WHERE id = ?", (id,))
        return None if row is None else _held(row)

    def release(self, id: int, by: str, at: float) -> HeldAction | None:
        """Mark held action ``id`` released by ``by`` at ``at`` and return it (the caller then carries it
        out). None when it is not held (unknown, or already released or discarded): a second call is a
        no-op, so one held action is released at most once, even by two processes racing."""
        return self._resolve(id, "released", by, at)

    def discard(self, id: int, by: str, at: float) -> HeldAction | None:
        """Mark held action ``id`` discarded; None when it is not held (see :meth:`release`)."""
        return self._resolve(id, "discarded", by, at)

    def prune(self, older_than: float) -> int:
        """Delete released and discarded actions resolved before ``older_than`` (held ones stay)."""
        return self._db.delete(
            "pruning held actions",
            "DELETE FROM held WHERE status != 'held' AND resolved_at < ?",
            (older_than,),
        )

    def _resolve(self, id: int, status: HeldStatus, by: str, at: float) -> HeldAction | None:
        with self._db.write(f"marking held action {id} {status}") as conn:
            cur = conn.execute(
                "UPDATE held SET status = ?, resolved_by = ?, resolved_at = ?"
                " WHERE id = ? AND status = 'held'",
                (status, by, at, id),
            )
            if cur.rowcount == 0:
                return None
            row = conn.execute(f"SELECT {_COLS} FROM held WHERE id = ?", (id,)).fetchone()
            return _held(row)


def _held(row: Row) -> HeldAction:
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
