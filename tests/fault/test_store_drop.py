"""PostgreSQL dropping under a burst of drains, against a real ``watchd engine`` on a real PostgreSQL
(tests/harness/postgres.py) with the fake scheduler (tests/fault/fake_slurm.py): a fast restart of the
server, the engine's sessions ended by ``pg_terminate_backend`` every 0.2 s, and the tables' file system
full. The test acts as the agents do (one batch per node, sent again until answered 200). What must hold:
every drain answered 200 is performed at the scheduler exactly once and audited exactly once, as done (a
batch answered 503 leaves a "failed: not recorded" record of the decision it refused, and a re-send may
leave a "deduplicated" one: as in test_kill9, neither is a second decision), and no intent is left
unfinished or unaudited. With the requeue after the drain (the sessions killed, the disk full): each node's
job is requeued exactly once at the scheduler, and audited "requeued" once."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.daemons import Daemon
from tests.fault.common import RULES, fake_slurm, full_log, post_events, scheduler_calls, start_engine, xid
from tests.fault.fake_slurm import job_of
from tests.harness.postgres import PostgresServer, available
from tests.support import real_components_required

pytestmark = pytest.mark.real

#: drains only (the restart costs one statement, a gate: the requeue adds nothing but time, a process each)
DRAIN_ONLY = RULES.replace("      - requeue\n", "")

TOOK_OUT = ("drained", "already_drained")
#: finished (not abandoned), and no audit record of it since decided (a re-send's "deduplicated" is not one)
UNAUDITED = (
    "SELECT key FROM intents i WHERE finished_at IS NOT NULL AND outcome != 'abandoned' AND NOT EXISTS"
    " (SELECT 1 FROM audit a WHERE a.node = i.node AND a.action = i.kind"
    " AND a.event_id IN (i.event_id, i.key) AND a.time >= i.decided_at AND a.outcome != 'deduplicated')"
)


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    ok, why = available()
    if not ok:
        if real_components_required():
            pytest.fail(f"PostgreSQL required (CI / WATCHD_REQUIRE_SLURM=1) but unavailable: {why}")
        pytest.skip(why)
    with PostgresServer() as server:
        yield server


@dataclass
class Burst:
    """One node per batch, as many agents would send them; each sent again until answered 200."""

    engine: Daemon
    nodes: list[str]
    spread_s: float  # the sends are spread over about this long
    answered: set[str] = field(default_factory=set)
    refused: int = 0  # answers other than 200 (each batch then sent again)
    retried: float | None = None  # the engine's drains retried after a store failure in their round
    started: float = 0.0
    settled_s: float = 0.0  # from the first send until every drain answered 200 was done and audited
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        self.started = time.monotonic()
        gap = self.spread_s / len(self.nodes)
        with ThreadPoolExecutor(8) as pool:
            for node in self.nodes:
                pool.submit(self._send, node)
                time.sleep(gap)

    def _send(self, node: str) -> None:
        event = xid(node)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                status, _ = post_events(self.engine, [event], timeout=20)
            except OSError:
                status = 0
            if status == 200:
                with self.lock:
                    self.answered.add(node)
                return
            with self.lock:
                self.refused += 1
            time.sleep(0.2)


def _rows(pg: PostgresServer, db: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg.dsn_with_password(db), autocommit=True) as conn:
        return list(conn.execute(sql).fetchall())  # type: ignore[arg-type]


def _engine(tmp: Path, pg: PostgresServer, db: str, nodes: int, knobs: dict[str, str], rules: str) -> Daemon:
    slurm, env = fake_slurm(tmp, pool=f"gpu-[1-{nodes}]")
    env.update(knobs)
    state = {"kind": "postgres", "postgres": {"dsn": pg.dsn(db), "password_file": str(pg.password_file)}}
    return start_engine(tmp, mode="enforce", rules=rules, fake=slurm, env=env, state=state)


@dataclass
class Verdict:
    answered: int
    lost: list[str]  # answered 200, never drained at the scheduler
    twice: list[str]  # drained more than once at the scheduler
    #: node -> the outcomes of its drain's audit records, leaving out those of re-sent batches (a decision
    #: not recorded, answered 503: "failed: not recorded"; a re-send de-duplicated): want one, drained
    audits: dict[str, list[str]]
    unfinished: list[str]
    unaudited: list[str]
    left_out: dict[str, int]  # the records left out, by outcome
    #: with the requeue after the drain (RULES): node -> its "requeued" records (want one), and the jobs
    #: requeued at the scheduler more than once, or never
    requeued: dict[str, int] | None = None
    jobs_twice: list[str] = field(default_factory=list)
    jobs_never: list[str] = field(default_factory=list)

    def wrong(self) -> dict[str, list[str]]:
        return {n: got for n, got in self.audits.items() if len(got) != 1 or got[0] not in TOOK_OUT}

    def requeues_wrong(self) -> dict[str, int]:
        return {n: c for n, c in (self.requeued or {}).items() if c != 1}

    def ok(self) -> bool:
        requeues = self.requeues_wrong() or self.jobs_twice or self.jobs_never
        return not (self.lost or self.twice or self.wrong() or self.unfinished or self.unaudited or requeues)


def _resent(outcome: str, detail: str) -> bool:
    """A record of a batch answered 503 (its decision's intent could not be begun: reading or recording it
    failed on the store, so nothing was done and the batch is sent again) or of a re-send."""
    refused = outcome == "failed" and detail.startswith("not recorded")
    return outcome == "deduplicated" or refused


def _verdict(tmp: Path, pg: PostgresServer, db: str, answered: set[str], requeue: bool = False) -> Verdict:
    drains = [c for c in scheduler_calls(tmp) if c["call"] == "drain" and c["phase"] == "done"]
    at_scheduler: dict[str, int] = {}
    for call in drains:
        for node in call["nodes"]:
            at_scheduler[node] = at_scheduler.get(node, 0) + 1
    audit = _rows(pg, db, "SELECT node, outcome, detail FROM audit WHERE action = 'drain' ORDER BY id")
    audits: dict[str, list[str]] = {n: [] for n in answered}
    left_out: dict[str, int] = {}
    for node, outcome, detail in audit:
        if _resent(outcome, detail):
            left_out[outcome] = left_out.get(outcome, 0) + 1
        else:
            audits.setdefault(node, []).append(outcome)
    verdict = Verdict(
        answered=len(answered),
        lost=sorted(n for n in answered if at_scheduler.get(n, 0) == 0),
        twice=sorted(n for n, c in at_scheduler.items() if c > 1),
        audits=audits,
        unfinished=[r[0] for r in _rows(pg, db, "SELECT key FROM intents WHERE finished_at IS NULL")],
        unaudited=[r[0] for r in _rows(pg, db, UNAUDITED)],
        left_out=left_out,
    )
    if requeue:  # each node's one job (fake_slurm.job_of): requeued once, audited "requeued" once
        requeued: dict[str, int] = dict.fromkeys(answered, 0)
        for (node,) in _rows(
            pg, db, "SELECT node FROM audit WHERE action = 'requeue' AND outcome = 'requeued'"
        ):
            requeued[node] = requeued.get(node, 0) + 1
        calls = [c for c in scheduler_calls(tmp) if c["call"] == "requeue" and c["phase"] == "done"]
        jobs = [j for c in calls for j in c["jobs"]]
        verdict.requeued = requeued
        verdict.jobs_twice = sorted({j for j in jobs if jobs.count(j) > 1})
        verdict.jobs_never = sorted(n for n in answered if str(job_of(n)) not in jobs)
    return verdict


def _settle(
    tmp: Path, pg: PostgresServer, db: str, answered: set[str], timeout: float, requeue: bool
) -> Verdict:
    """Wait (bounded) for every drain answered 200 to be done and audited; the verdict either way."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(psycopg.Error):
            verdict = _verdict(tmp, pg, db, answered, requeue)
            if verdict.ok() or time.monotonic() > deadline:
                time.sleep(0.5)  # anything done twice would show now
                return _verdict(tmp, pg, db, answered, requeue)
        time.sleep(0.25)


def _metric(engine: Daemon, series: str) -> float | None:
    """A series' value on the engine's /metrics; None when it has none (an engine before it existed)."""
    for line in engine.get("/metrics").splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def _error_lines(engine: Daemon) -> int:
    count = 0
    for line in full_log(engine).splitlines():
        with contextlib.suppress(ValueError):
            if json.loads(line).get("level") == "error":
                count += 1
    return count


def _during_burst(
    tmp: Path,
    pg: PostgresServer,
    nodes: int,
    fault: Callable[[Burst], None],
    *,
    spread_s: float,
    knobs: dict[str, str] | None = None,
    db: str | None = None,
    rules: str = DRAIN_ONLY,
) -> tuple[Verdict, Burst, int]:
    """Start an engine, send the burst, inject ``fault`` meanwhile (in this thread), wait for the drains
    answered 200 to settle; the verdict, the burst, the engine's error lines."""
    db = db or pg.create_database()
    engine = _engine(tmp, pg, db, nodes, knobs or {}, rules)
    try:
        burst = Burst(engine, [f"gpu-{i}" for i in range(1, nodes + 1)], spread_s=spread_s)
        sender = threading.Thread(target=burst.run)
        sender.start()
        fault(burst)
        sender.join(120)
        # an action interrupted again and again waits longer each time (doubling): on 2 loaded cores its
        # last re-drive can come later than a minute after the fault ends
        verdict = _settle(tmp, pg, db, burst.answered, timeout=120, requeue=rules == RULES)
        burst.settled_s = time.monotonic() - burst.started
        assert engine.proc.poll() is None, engine.log()
        burst.retried = _metric(engine, 'watchd_drain_store_failures_total{result="retried"}')
        return verdict, burst, _error_lines(engine)
    finally:
        engine.stop()


def _big_round(tmp: Path, call: str, min_nodes: int = 10, timeout: float = 30.0) -> float:
    """Wait for the scheduler call ``call`` (``show``: a round reading node states; ``drain``) of a round
    of at least ``min_nodes`` nodes to start; when it started (time.time())."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in scheduler_calls(tmp):
            if c["call"] == call and c["phase"] == "start" and len(c["nodes"]) >= min_nodes:
                return float(c["t"])
        time.sleep(0.01)
    raise AssertionError(f"no {call} of {min_nodes} nodes or more in {timeout}s")


def _report(verdict: Verdict, burst: Burst, errors: int) -> str:
    wrong = verdict.wrong()
    return (
        f"answered 200: {verdict.answered} (refused and re-sent: {burst.refused}); "
        f"lost: {len(verdict.lost)} {verdict.lost[:10]}; drained twice: {verdict.twice[:10]}; "
        f"audit records not one 'drained': {len(wrong)} {dict(list(wrong.items())[:10])}; "
        f"unfinished intents: {verdict.unfinished[:10]}; unaudited: {verdict.unaudited[:10]}; "
        f"requeues audited != 1: {dict(list(verdict.requeues_wrong().items())[:10])}, jobs requeued twice: "
        f"{verdict.jobs_twice[:10]}, never: {verdict.jobs_never[:10]}; "
        f"records of re-sent batches: {verdict.left_out}; drains retried: {burst.retried}; "
        f"settled in {burst.settled_s:.1f} s; "
        f"error lines: {errors}"
    )


def test_fast_restart_of_postgres_during_a_burst_loses_no_drain(tmp_path: Path, pg: PostgresServer) -> None:
    """The restart (0.2 s here) lands while a round of most of the burst reads the node states (slowed to
    1.5 s by the fake), so the server is back before the round's safety gates: the first statement on the
    engine's old connection fails, the next reconnects. The independent round hit this window by chance."""
    for round_ in range(2):
        tmp = tmp_path / f"round-{round_}"
        tmp.mkdir()

        def restart(burst: Burst, tmp: Path = tmp) -> None:
            started = _big_round(tmp, "show")
            time.sleep(max(0.0, started + 0.3 - time.time()))
            pg.restart("fast")

        knobs = {"FAKE_SLURM_SHOW_DELAY_S": "1.5"}
        verdict, burst, errors = _during_burst(tmp, pg, 120, restart, spread_s=0.6, knobs=knobs)
        print(f"round {round_}: {_report(verdict, burst, errors)}")
        assert verdict.answered == 120
        assert verdict.ok(), _report(verdict, burst, errors)


def test_sessions_killed_every_200ms_during_a_burst_lose_no_drain(tmp_path: Path, pg: PostgresServer) -> None:
    def kill_sessions(burst: Burst) -> None:
        time.sleep(0.3)
        end = time.monotonic() + 6.0
        while time.monotonic() < end:
            pg.terminate_sessions("watchd-engine")
            time.sleep(0.2)

    for round_ in range(2):
        tmp = tmp_path / f"round-{round_}"
        tmp.mkdir()
        verdict, burst, errors = _during_burst(tmp, pg, 200, kill_sessions, spread_s=6.0, rules=RULES)
        print(f"round {round_}: {_report(verdict, burst, errors)}")
        assert verdict.answered == 200
        assert verdict.ok(), _report(verdict, burst, errors)


@pytest.fixture
def small_tablespace(tmp_path: Path, pg: PostgresServer) -> Iterator[tuple[str, Path]]:
    """A database whose tables and indexes live on an 8 MiB tmpfs (a tablespace; the server's WAL stays on
    its own disk): filling that tmpfs is the disk of the tables full. Skips only where mount is impossible
    (not root), and under CI fails instead."""
    mnt = Path(tempfile.mkdtemp(prefix="watchd-small-"))  # the server's user must reach it: not tmp_path
    mnt.chmod(0o755)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        why = f"cannot mount a tmpfs: {mounted.stderr.strip()}"
        if real_components_required():
            pytest.fail(why)
        pytest.skip(why)
    space = f"small_{int(time.time() * 1000) % 10**9}"
    try:
        (mnt / "pg").mkdir()
        pg.chown_to_server(mnt / "pg")
        pg.chown_to_server(mnt)
        with psycopg.connect(pg.dsn_with_password(), autocommit=True) as conn:
            conn.execute(f"CREATE TABLESPACE {space} LOCATION '{mnt / 'pg'}'")  # type: ignore[arg-type]
            conn.execute(f'CREATE DATABASE "{space}" TABLESPACE {space}')  # type: ignore[arg-type]
        yield space, mnt
    finally:
        with psycopg.connect(pg.dsn_with_password(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{space}" WITH (FORCE)')  # type: ignore[arg-type]
            conn.execute(f"DROP TABLESPACE IF EXISTS {space}")  # type: ignore[arg-type]
        for _ in range(20):
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        mnt.rmdir()


def _fill(mnt: Path) -> Path:
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 8192)
    return filler


def test_tables_disk_full_during_a_burst_loses_no_drain(
    tmp_path: Path, pg: PostgresServer, small_tablespace: tuple[str, Path]
) -> None:
    db, mnt = small_tablespace

    def disk_full(burst: Burst) -> None:
        """Full while a round of most of the burst is at the scheduler (slowed to 1.5 s by the fake): its
        finishes and audit records, and the next rounds' gates, meet the full disk; space returns 3 s on."""
        started = _big_round(tmp_path, "drain")
        time.sleep(max(0.0, started + 0.3 - time.time()))
        filler = _fill(mnt)
        time.sleep(3.0)
        filler.unlink()

    knobs = {"FAKE_SLURM_DELAY_S": "1.5", "FAKE_SLURM_DELAY_ON": "drain"}
    verdict, burst, errors = _during_burst(
        tmp_path, pg, 120, disk_full, spread_s=3.0, knobs=knobs, db=db, rules=RULES
    )
    print(_report(verdict, burst, errors))
    assert verdict.answered == 120
    assert verdict.ok(), _report(verdict, burst, errors)
