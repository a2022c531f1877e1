"""The audit trail in the state database: every action decided, with its outcome."""

from __future__ import annotations

import json

from watchd.actions.audit import AuditRecord
from watchd.store.connection import Connection, Row, dump, text

_COLS = "time, rule, event_id, node, action, mode, outcome, detail, duration_s, params, result"


class AuditLog:
    def __init__(self, db: Connection) -> None:
        self._db = db

    def append(self, rec: AuditRecord) -> int:
        """Append one audit record; returns its row id."""
        with self._db.write("appending to the audit trail") as conn:
            cur = conn.execute(
                f"INSERT INTO audit ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    rec.time,
                    text(rec.rule),
                    text(rec.event_id),
                    text(rec.node),
                    text(rec.action),
                    text(rec.mode),
                    text(str(rec.outcome)),
                    text(rec.detail),
                    rec.duration_s,
                    dump(rec.params),
                    dump(rec.result),
                ),
            )
            return int(cur.lastrowid or 0)

    def recent(self, limit: int = 100, node: str | None = None) -> list[AuditRecord]:
        """The last ``limit`` records (of ``node`` when given), oldest first."""
        if node is None:
            rows = self._db.all(
                "reading the audit trail", f"SELECT {_COLS} FROM audit ORDER BY id DESC LIMIT ?", (limit,)
            )
        else:
            rows = self._db.all(
                "reading the audit trail",
                f"SELECT {_COLS} FROM audit WHERE node = ? ORDER BY id DESC LIMIT ?",
                (text(node), limit),
            )
        return [_record(r) for r in reversed(rows)]

    def since(self, time: float, limit: int) -> list[AuditRecord]:
        """The records after ``time`` (at most the first ``limit`` of them), oldest first."""
        rows = self._db.all(
            "reading the audit trail",
            f"SELECT {_COLS} FROM audit WHERE time > ? ORDER BY time, id LIMIT ?",
            (time, limit),
        )
        return [_record(r) for r in rows]

    def prune(self, older_than: float) -> int:
        """Delete audit records with ``time < older_than``; returns how many."""
        return self._db.delete("pruning the audit trail", "DELETE FROM audit WHERE time < ?", (older_than,))


def _record(row: Row) -> AuditRecord:
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
        result=json.loads(row["result"]),
    )
