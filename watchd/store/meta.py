"""A small key/value table for the database's own bookkeeping."""

from __future__ import annotations

from watchd.store.connection import Connection


class Meta:
    def __init__(self, db: Connection) -> None:
        self._db = db

    def set(self, key: str, value: str) -> None:
        with self._db.write(f"setting meta {key}") as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def get(self, key: str) -> str | None:
        row = self._db.one("reading meta", "SELECT value FROM meta WHERE key = ?", (key,))
        return None if row is None else str(row[0])

    def delete(self, key: str) -> None:
        self._db.delete(f"deleting meta {key}", "DELETE FROM meta WHERE key = ?", (key,))
