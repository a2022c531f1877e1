"""Reliability accounting in the state database: node service intervals, failures, and what is
known of each node (GPU model and count, partitions, out of service since). Rows are plain tuples: the
accounting itself (:mod:`watchd.reliability`) turns them into its own data."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from watchd.store.connection import Connection

PAGE = 5_000  # rows per query of a long read: the caller may serve its event loop between pages


class IntervalRow(NamedTuple):
    node: str
    start: float
    end: float


class FailureRow(NamedTuple):
    id: int
    time: float
    node: str
    rule: str
    event_id: str
    evidence: str
    gpu: int | None
    mode: str
    back_at: float | None


class NodeRow(NamedTuple):
    node: str
    gpu_model: str | None
    gpus: int
    partitions: tuple[str, ...]
    out_since: float | None


class ReliabilityRecord:
    def __init__(self, db: Connection) -> None:
        self._db = db

    def save_intervals(self, rows: Iterable[IntervalRow]) -> None:
        """Insert each interval, or extend the end of the one with the same (node, start)."""
        with self._db.write("saving service intervals") as conn:
            conn.executemany(
                "INSERT INTO service_intervals (node, started_at, ended_at) VALUES (?, ?, ?)"
                " ON CONFLICT (node, started_at) DO UPDATE SET ended_at = CASE"
                " WHEN excluded.ended_at > service_intervals.ended_at THEN excluded.ended_at"
                " ELSE service_intervals.ended_at END",
                rows,
            )

    def save_nodes(self, rows: Iterable[NodeRow]) -> None:
        with self._db.write("saving service nodes") as conn:
            conn.executemany(
                "INSERT INTO service_nodes (node, gpu_model, gpus, partitions, out_since)"
                " VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (node) DO UPDATE SET gpu_model = excluded.gpu_model, gpus = excluded.gpus,"
                " partitions = excluded.partitions, out_since = excluded.out_since",
                ((r.node, r.gpu_model, r.gpus, ",".join(r.partitions), r.out_since) for r in rows),
            )

    def add_failure(
        self, time: float, node: str, rule: str, event_id: str, evidence: str, gpu: int | None, mode: str
    ) -> int:
        with self._db.write("recording a failure") as conn:
            cur = conn.execute(
                "INSERT INTO failures (time, node, rule, event_id, evidence, gpu, mode)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (time, node, rule, event_id, evidence, gpu, mode),
            )
            return int(cur.lastrowid or 0)

    def close_failures(self, node: str, back_at: float) -> int:
        """The node is back in service: its open failures end at ``back_at``."""
        with self._db.write("closing failures") as conn:
            return conn.execute(
                # CASE, not MAX(a, b): a scalar MAX is SQLite's alone (the store also runs on PostgreSQL)
                "UPDATE failures SET back_at = CASE WHEN time > ? THEN time ELSE ? END"
                " WHERE node = ? AND back_at IS NULL",
                (back_at, back_at, node),
            ).rowcount

    def interval_pages(self, since: float, page: int = PAGE) -> Iterator[list[IntervalRow]]:
        """The intervals that ended at or after ``since``, ``page`` rows a query (keyset order)."""
        first = "SELECT node, started_at, ended_at FROM service_intervals WHERE ended_at >= ?"
        for rows in self._pages(
            "reading service intervals",
            first,
            first + " AND (node, started_at) > (?, ?)",
            (since,),
            "node, started_at",
            lambda r: (r[0], r[1]),
            page,
        ):
            yield [IntervalRow(r[0], r[1], r[2]) for r in rows]

    def failure_pages(self, since: float, page: int = PAGE) -> Iterator[list[FailureRow]]:
        """The failures at or after ``since``, ``page`` rows a query (in id order, not time order)."""
        first = (
            "SELECT id, time, node, rule, event_id, evidence, gpu, mode, back_at FROM failures"
            " WHERE time >= ?"
        )
        for rows in self._pages(
            "reading failures", first, first + " AND id > ?", (since,), "id", lambda r: (r[0],), page
        ):
            yield [FailureRow(*tuple(r)) for r in rows]

    def node_pages(self, page: int = PAGE) -> Iterator[list[NodeRow]]:
        """Every node known, ``page`` rows a query (in node order)."""
        first = "SELECT node, gpu_model, gpus, partitions, out_since FROM service_nodes"
        for rows in self._pages(
            "reading service nodes", first, first + " WHERE node > ?", (), "node", lambda r: (r[0],), page
        ):
            yield [NodeRow(r[0], r[1], r[2], tuple(p for p in r[3].split(",") if p), r[4]) for r in rows]

    def intervals(self, since: float) -> list[IntervalRow]:
        return [row for rows in self.interval_pages(since) for row in rows]

    def failures(self, since: float) -> list[FailureRow]:
        """The failures at or after ``since``, oldest first."""
        rows = [row for page in self.failure_pages(since) for row in page]
        return sorted(rows, key=lambda f: (f.time, f.id))

    def nodes(self) -> list[NodeRow]:
        return [row for rows in self.node_pages() for row in rows]

    def _pages(
        self,
        doing: str,
        first: str,
        after: str,
        args: tuple[Any, ...],
        order: str,
        key: Any,
        page: int,
    ) -> Iterator[list[Any]]:
        """Keyset pagination: each page is its own query, so nothing stays open between pages."""
        rows = self._db.all(doing, f"{first} ORDER BY {order} LIMIT ?", (*args, page))
        while rows:
            yield rows
            if len(rows) < page:
                return
            rows = self._db.all(doing, f"{after} ORDER BY {order} LIMIT ?", (*args, *key(rows[-1]), page))

    def prune(self, older_than: float) -> tuple[int, list[str]]:
        """Forget intervals that ended, and failures that happened, before ``older_than``, then the nodes
        left with neither and not out of service (a renamed or retired node would otherwise be read by
        every report forever). Returns the rows removed and the nodes forgotten."""
        with self._db.write("pruning reliability records") as conn:
            n = conn.execute("DELETE FROM service_intervals WHERE ended_at < ?", (older_than,)).rowcount
            n += conn.execute("DELETE FROM failures WHERE time < ?", (older_than,)).rowcount
            gone = conn.execute(
                "DELETE FROM service_nodes WHERE out_since IS NULL"
                " AND NOT EXISTS (SELECT 1 FROM service_intervals i WHERE i.node = service_nodes.node)"
                " AND node NOT IN (SELECT node FROM failures) RETURNING node"
            ).fetchall()
            return n + len(gone), [str(r[0]) for r in gone]
