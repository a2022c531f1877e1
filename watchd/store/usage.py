"""What watchd observed per job for the usage report: energy, observed and idle GPU-seconds per
job, node, GPU and day; the job's checkpoints. Written by the engine from :class:`watchd.reports.ledger.
UsageLedger`; read by ``watchd report usage``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from watchd.store.connection import Connection

#: checkpoints kept per job (the newest)
MAX_CHECKPOINTS = 32


class JobUsage:
    def __init__(self, db: Connection) -> None:
        self._db = db

    def add(self, gpus: Iterable[Sequence[object]], checkpoints: Iterable[tuple[str, float]]) -> None:
        """``gpus``: rows (job, node, gpu, day, energy_j, gpu_s, idle_s, first, last), added to what is
        stored; ``checkpoints``: (job, time)."""
        rows = [tuple(r) for r in gpus]
        cps = list(checkpoints)
        if not rows and not cps:
            return
        with self._db.write("recording job usage") as tx:
            # both dialects: the table's own columns named with the table (PostgreSQL finds a bare name
            # ambiguous beside excluded.), CASE for the scalar min/max (min() is an aggregate there)
            tx.executemany(
                "INSERT INTO job_gpu_usage (job, node, gpu, day, energy_j, gpu_s, idle_s, first, last)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job, node, gpu, day) DO UPDATE SET"
                " energy_j = job_gpu_usage.energy_j + excluded.energy_j,"
                " gpu_s = job_gpu_usage.gpu_s + excluded.gpu_s,"
                " idle_s = job_gpu_usage.idle_s + excluded.idle_s,"
                " first = CASE WHEN excluded.first < job_gpu_usage.first THEN excluded.first"
                " ELSE job_gpu_usage.first END,"
                " last = CASE WHEN excluded.last > job_gpu_usage.last THEN excluded.last"
                " ELSE job_gpu_usage.last END",
                rows,
            )
            tx.executemany("INSERT INTO job_checkpoints (job, at) VALUES (?, ?) ON CONFLICT DO NOTHING", cps)
            for job in {j for j, _ in cps}:
                tx.execute(
                    "DELETE FROM job_checkpoints WHERE job = ? AND at NOT IN"
                    " (SELECT at FROM job_checkpoints WHERE job = ? ORDER BY at DESC LIMIT ?)",
                    (job, job, MAX_CHECKPOINTS),
                )

    def gpu_rows(
        self, start: float, end: float
    ) -> list[tuple[str, str, int, float, float, float, float, float]]:
        """Per job, node and GPU, summed over the days that overlap ``[start, end)``: (job, node, gpu,
        energy_j, gpu_s, idle_s, first, last)."""
        rows = self._db.all(
            "reading job usage",
            "SELECT job, node, gpu, sum(energy_j), sum(gpu_s), sum(idle_s), min(first), max(last)"
            " FROM job_gpu_usage WHERE last >= ? AND first < ? GROUP BY job, node, gpu",
            (start, end),
        )
        return [(r[0], r[1], int(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows]

    def checkpoints(self) -> dict[str, tuple[float, ...]]:
        out: dict[str, list[float]] = {}
        for r in self._db.all("reading checkpoints", "SELECT job, at FROM job_checkpoints ORDER BY job, at"):
            out.setdefault(r[0], []).append(float(r[1]))
        return {k: tuple(v) for k, v in out.items()}

    def prune(self, older_than: float) -> int:
        n = self._db.delete("pruning job usage", "DELETE FROM job_gpu_usage WHERE last < ?", (older_than,))
        n += self._db.delete("pruning checkpoints", "DELETE FROM job_checkpoints WHERE at < ?", (older_than,))
        return n

    def faults(self, start: float, end: float) -> list[tuple[str, float, str, str]]:
        """watchd's own drains and requeues in ``[start, end)`` from the audit trail: (node, time, action,
        detail); dry runs and failures are left out."""
        rows = self._db.all(
            "reading the audit trail for faults",
            "SELECT node, time, action, detail FROM audit WHERE time >= ? AND time < ?"
            " AND action IN ('drain', 'requeue') AND outcome IN ('drained', 'requeued', 'partial')",
            (start, end),
        )
        return [(r[0], float(r[1]), r[2], r[3]) for r in rows]
