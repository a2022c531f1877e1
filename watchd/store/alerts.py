"""The alerts watchd has firing, so that a restart fires them again instead of letting the pages expire."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from watchd.store.connection import Connection, dump


class FiringAlerts:
    def __init__(self, db: Connection) -> None:
        self._db = db

    def set(self, key: str, alert: Mapping[str, Any], resolve_at: float) -> None:
        with self._db.write(f"recording the firing alert {key}") as conn:
            conn.execute(
                "INSERT INTO firing_alerts (key, alert, resolve_at) VALUES (?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET alert = excluded.alert, resolve_at = excluded.resolve_at",
                (key, dump(alert), resolve_at),
            )

    def clear(self, key: str) -> None:
        self._db.delete(f"clearing the firing alert {key}", "DELETE FROM firing_alerts WHERE key = ?", (key,))

    def list(self) -> list[tuple[str, dict[str, Any], float]]:
        """(key, alert as recorded, when it is to resolve), oldest resolution first."""
        rows = self._db.all(
            "reading the firing alerts",
            "SELECT key, alert, resolve_at FROM firing_alerts ORDER BY resolve_at",
        )
        return [(str(r[0]), json.loads(r[1]), float(r[2])) for r in rows]
