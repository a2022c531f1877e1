"""The blast-radius breaker's window: which nodes of a pool watchd disrupted, and when."""

from __future__ import annotations

from watchd.store.connection import Connection


class BreakerWindow:
    def __init__(self, db: Connection) -> None:
        self._db = db

    def record(self, pool: str, node: str, at: float) -> None:
        with self._db.write(f"recording a disruption of {node}") as conn:
            conn.execute("INSERT INTO disruptions (pool, node, at) VALUES (?, ?, ?)", (pool, node, at))

    def forget(self, pool: str, node: str, at: float) -> None:
        """Take back a disruption counted in advance (the action then failed or changed nothing)."""
        with self._db.write(f"forgetting a disruption of {node}") as conn:
            conn.execute("DELETE FROM disruptions WHERE pool = ? AND node = ? AND at = ?", (pool, node, at))

    def since(self, pool: str, since: float) -> list[tuple[str, float]]:
        """The distinct nodes of ``pool`` disrupted at or after ``since``, each with its latest disruption,
        oldest first: ``len()`` of it is what a breaker counts."""
        rows = self._db.all(
            "reading the breaker window",
            "SELECT node, MAX(at) AS last FROM disruptions WHERE pool = ? AND at >= ?"
            " GROUP BY node ORDER BY last, node",
            (pool, since),
        )
        return [(str(r[0]), float(r[1])) for r in rows]

    def prune(self, older_than: float) -> int:
        return self._db.delete(
            "pruning the breaker window", "DELETE FROM disruptions WHERE at < ?", (older_than,)
        )
