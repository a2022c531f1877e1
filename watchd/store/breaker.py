"""The blast-radius breaker's window: which nodes of a pool watchd disrupted, and when."""

from __future__ import annotations

from collections.abc import Sequence

from watchd.store.connection import Connection


class BreakerWindow:
    def __init__(self, db: Connection) -> None:
        self._db = db

    def record(self, pool: str, node: str, at: float) -> None:
        with self._db.write(f"recording a disruption of {node}") as conn:
            conn.execute("INSERT INTO disruptions (pool, node, at) VALUES (?, ?, ?)", (pool, node, at))

    def record_all(self, pools: Sequence[str], node: str, at: float) -> None:
        """Count one disruption of ``node`` in every one of ``pools``, in one transaction: all or none."""
        with self._db.write(f"recording a disruption of {node}") as conn:
            for pool in pools:
                conn.execute("INSERT INTO disruptions (pool, node, at) VALUES (?, ?, ?)", (pool, node, at))

    def forget(self, pool: str, node: str, at: float) -> None:
        """Take back a disruption counted in advance (the action then failed or changed nothing)."""
        with self._db.write(f"forgetting a disruption of {node}") as conn:
            conn.execute("DELETE FROM disruptions WHERE pool = ? AND node = ? AND at = ?", (pool, node, at))

    def since(self, pool: str, since: float, limit: int | None = None) -> list[tuple[str, float]]:
        """The distinct nodes of ``pool`` disrupted at or after ``since``, each with its latest disruption,
        oldest first: ``len()`` of it is what a breaker counts (:meth:`count` counts without reading them).
        With ``limit``: only the ``limit`` most recent of them (still oldest first)."""
        if limit is None:
            rows = self._db.all(
                "reading the breaker window",
                "SELECT node, MAX(at) AS last FROM disruptions WHERE pool = ? AND at >= ?"
                " GROUP BY node ORDER BY last, node",
                (pool, since),
            )
        else:
            rows = self._db.all(
                "reading the breaker window",
                "SELECT node, MAX(at) AS last FROM disruptions WHERE pool = ? AND at >= ?"
                " GROUP BY node ORDER BY last DESC, node DESC LIMIT ?",
                (pool, since, limit),
            )[::-1]
        return [(str(r[0]), float(r[1])) for r in rows]

    def count(self, pool: str, since: float) -> int:
        """How many distinct nodes of ``pool`` were disrupted at or after ``since`` (one SQL count)."""
        row = self._db.one(
            "reading the breaker window",
            "SELECT count(DISTINCT node) FROM disruptions WHERE pool = ? AND at >= ?",
            (pool, since),
        )
        return 0 if row is None else int(row[0])

    def contains(self, pool: str, node: str, since: float) -> bool:
        """Whether ``node`` of ``pool`` was disrupted at or after ``since`` (one indexed lookup)."""
        row = self._db.one(
            "reading the breaker window",
            "SELECT 1 FROM disruptions WHERE pool = ? AND node = ? AND at >= ? LIMIT 1",
            (pool, node, since),
        )
        return row is not None

    def prune(self, older_than: float) -> int:
        return self._db.delete(
            "pruning the breaker window", "DELETE FROM disruptions WHERE at < ?", (older_than,)
        )
