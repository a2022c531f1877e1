"""Active checks: each round of a check, each run on a node (started, with its scheduler job, then
finished with its outcome), and where each node stands per check (last round, last result, last success, the
back-off). A restart reads it back: an unfinished run is followed to its end (the job keeps running), a round
is resumed, never repeated for a node that already has its result."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from watchd.store.connection import Connection, dump

__all__ = ["CheckNode", "CheckRun", "CheckRuns"]

_RUN_COLS = (
    "run_id, check_name, node, round, validation, job_id, job_output, started_at, finished_at, outcome, "
    "evidence, figures, job_nonce"
)


@dataclass(frozen=True, slots=True)
class CheckRun:
    run_id: str
    check: str
    node: str
    round: str
    validation: bool
    job_id: str
    job_output: str
    started_at: float
    finished_at: float | None
    outcome: str | None
    evidence: str
    figures: dict[str, Any]
    job_nonce: str = ""  # the secret the job printed first (its output is bound to it); never shown

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "check": self.check,
            "node": self.node,
            "round": self.round,
            "validation": self.validation,
            "job": self.job_id,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "outcome": self.outcome,
            "evidence": self.evidence,
            "figures": self.figures,
        }


@dataclass(frozen=True, slots=True)
class CheckNode:
    check: str
    node: str
    last_round: str
    last_run: float | None
    last_outcome: str
    last_success: float | None
    failures: int  # consecutive runs that could not be judged (error, timeout)
    next_try: float


def _run(r: sqlite3.Row) -> CheckRun:
    try:
        figures = json.loads(r["figures"])
    except ValueError:
        figures = {}
    return CheckRun(
        run_id=r["run_id"],
        check=r["check_name"],
        node=r["node"],
        round=r["round"],
        validation=bool(r["validation"]),
        job_id=r["job_id"],
        job_output=r["job_output"],
        started_at=float(r["started_at"]),
        finished_at=None if r["finished_at"] is None else float(r["finished_at"]),
        outcome=r["outcome"],
        evidence=r["evidence"],
        figures=figures if isinstance(figures, dict) else {},
        job_nonce=r["job_nonce"],
    )


def _node(r: sqlite3.Row) -> CheckNode:
    return CheckNode(
        check=r["check_name"],
        node=r["node"],
        last_round=r["last_round"],
        last_run=r["last_run"],
        last_outcome=r["last_outcome"],
        last_success=r["last_success"],
        failures=int(r["failures"]),
        next_try=float(r["next_try"]),
    )


class CheckRuns:
    def __init__(self, db: Connection) -> None:
        self._db = db

    # ------------------------------------------------------------------------------------------- rounds
    def begin_round(self, check: str, round_id: str, scheduled_at: float, now: float) -> None:
        with self._db.write(f"starting round {round_id}") as tx:
            tx.execute(
                "INSERT INTO check_rounds (check_name, round, scheduled_at, started_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (check_name, round) DO NOTHING",
                (check, round_id, scheduled_at, now),
            )

    def finish_round(self, check: str, round_id: str, now: float) -> None:
        with self._db.write(f"finishing round {round_id}") as tx:
            tx.execute(
                "UPDATE check_rounds SET finished_at = ? WHERE check_name = ? AND round = ?",
                (now, check, round_id),
            )

    def last_round(self, check: str) -> tuple[str, float, float | None] | None:
        """The newest round of ``check``: (round, scheduled_at, finished_at)."""
        r = self._db.one(
            "reading the last round",
            "SELECT round, scheduled_at, finished_at FROM check_rounds WHERE check_name = ?"
            " ORDER BY scheduled_at DESC, started_at DESC LIMIT 1",
            (check,),
        )
        if r is None:
            return None
        return str(r[0]), float(r[1]), None if r[2] is None else float(r[2])

    # --------------------------------------------------------------------------------------------- runs
    def start(
        self, run_id: str, check: str, node: str, round_id: str, now: float, *, validation: bool = False
    ) -> None:
        with self._db.write(f"starting check {check} on {node}") as tx:
            tx.execute(
                "INSERT INTO check_runs (run_id, check_name, node, round, validation, started_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, check, node, round_id, int(validation), now),
            )

    def submitted(self, run_id: str, job_id: str, job_output: str, job_nonce: str = "") -> None:
        with self._db.write(f"recording job {job_id}") as tx:
            tx.execute(
                "UPDATE check_runs SET job_id = ?, job_output = ?, job_nonce = ? WHERE run_id = ?",
                (job_id, job_output, job_nonce, run_id),
            )

    def skip(self, run_id: str, now: float, evidence: str) -> None:
        """A run whose job never started because its node left service meanwhile: recorded as ``skipped``,
        no verdict on the node, so the node's standing (failures, back-off, last success) is left as is."""
        with self._db.write(f"skipping run {run_id}") as tx:
            tx.execute(
                "UPDATE check_runs SET finished_at = ?, outcome = 'skipped', evidence = ?, figures = '{}'"
                " WHERE run_id = ?",
                (now, evidence, run_id),
            )

    def finish(
        self,
        run_id: str,
        now: float,
        outcome: str,
        evidence: str,
        figures: dict[str, Any],
        *,
        backoff: tuple[float, float] = (600.0, 86400.0),
        count_round: bool = True,
    ) -> CheckNode | None:
        """Record the outcome of a run and where its node stands now (a run that could not be judged,
        ``error`` or ``timeout``, adds a failure and pushes the next try back; any judged run clears it)."""
        with self._db.write(f"finishing run {run_id}") as tx:
            row = tx.execute(f"SELECT {_RUN_COLS} FROM check_runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                return None
            run = _run(row)
            tx.execute(
                "UPDATE check_runs SET finished_at = ?, outcome = ?, evidence = ?, figures = ?"
                " WHERE run_id = ?",
                (now, outcome, evidence, dump(figures), run_id),
            )
            prev = tx.execute(
                "SELECT failures, last_success, last_round FROM check_nodes"
                " WHERE check_name = ? AND node = ?",
                (run.check, run.node),
            ).fetchone()
            failures = int(prev[0]) if prev is not None else 0
            last_success = prev[1] if prev is not None else None
            last_round = run.round if count_round else (str(prev[2]) if prev is not None else "")
            if outcome in ("error", "timeout"):
                failures += 1
                initial, most = backoff
                next_try = now + min(most, initial * 2 ** (failures - 1))
            else:
                failures, next_try = 0, 0.0
            if outcome == "passed":
                last_success = now
            tx.execute(
                "INSERT INTO check_nodes (check_name, node, last_round, last_run, last_outcome, last_success,"
                " failures, next_try) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (check_name, node) DO UPDATE SET last_round = excluded.last_round,"
                " last_run = excluded.last_run, last_outcome = excluded.last_outcome,"
                " last_success = excluded.last_success, failures = excluded.failures,"
                " next_try = excluded.next_try",
                (
                    run.check,
                    run.node,
                    last_round,
                    now,
                    outcome,
                    last_success,
                    failures,
                    next_try,
                ),
            )
        return CheckNode(run.check, run.node, last_round, now, outcome, last_success, failures, next_try)

    def unfinished(self) -> list[CheckRun]:
        rows = self._db.all(
            "reading unfinished check runs",
            f"SELECT {_RUN_COLS} FROM check_runs WHERE finished_at IS NULL ORDER BY id",
        )
        return [_run(r) for r in rows]

    def in_round(self, check: str, round_id: str) -> list[CheckRun]:
        rows = self._db.all(
            "reading a round's runs",
            f"SELECT {_RUN_COLS} FROM check_runs WHERE check_name = ? AND round = ? ORDER BY id",
            (check, round_id),
        )
        return [_run(r) for r in rows]

    def since(self, check: str, start: float) -> list[CheckRun]:
        """The check's runs started at or after ``start`` (the risk planner's budget and durations)."""
        rows = self._db.all(
            "reading a check's recent runs",
            f"SELECT {_RUN_COLS} FROM check_runs WHERE check_name = ? AND started_at >= ? ORDER BY id",
            (check, start),
        )
        return [_run(r) for r in rows]

    def history(self, node: str, limit: int = 20) -> list[CheckRun]:
        rows = self._db.all(
            "reading a node's check history",
            f"SELECT {_RUN_COLS} FROM check_runs WHERE node = ? ORDER BY id DESC LIMIT ?",
            (node, limit),
        )
        return [_run(r) for r in rows]

    def nodes(self, check: str) -> dict[str, CheckNode]:
        rows = self._db.all(
            "reading where nodes stand",
            "SELECT check_name, node, last_round, last_run, last_outcome, last_success, failures, next_try"
            " FROM check_nodes WHERE check_name = ?",
            (check,),
        )
        return {r["node"]: _node(r) for r in rows}

    def all_nodes(self) -> list[CheckNode]:
        rows = self._db.all(
            "reading where nodes stand",
            "SELECT check_name, node, last_round, last_run, last_outcome, last_success, failures, next_try"
            " FROM check_nodes",
        )
        return [_node(r) for r in rows]

    def prune(self, before: float) -> int:
        """Finished runs older than ``before`` (the rounds with them)."""
        n = self._db.delete(
            "pruning check runs",
            "DELETE FROM check_runs WHERE finished_at IS NOT NULL AND finished_at < ?",
            (before,),
        )
        self._db.delete(
            "pruning check rounds",
            "DELETE FROM check_rounds WHERE finished_at IS NOT NULL AND finished_at < ?",
            (before,),
        )
        return n
