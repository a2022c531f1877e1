"""PostgreSQL dropping under a burst of drains, against a real ``watchd engine`` on a real PostgreSQL
(tests/harness/postgres.py) with the fake scheduler (tests/fault/fake_slurm.py): a fast restart of the
server, the engine's sessions ended by ``pg_terminate_backend`` every 0.2 s, and the tables' file system
full. The test acts as the agents do (one batch per node, sent again until answered 200). What must hold:
every drain answered 200 is performed at the scheduler exactly once and audited exactly once as done, and
no intent is left unfinished or unaudited."""

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
from tests.fault.common import fake_slurm, full_log, post_events, scheduler_calls, start_engine, xid
from tests.harness.postgres import PostgresServer, available
from tests.support import real_components_required

pytestmark = pytest.mark.real

#: drains only: the requeue is another scheduler call per node (a Python process each, in the fake)
DRAIN_ONLY = """
rules:
  - name: fatal-xid
    severity: critical
    match: {kind: xid, xid: 79}
    actions:
      - drain: {reason: "Xid {{ xid }} GPU {{ pci_bus_id }}"}
"""

TOOK_OUT = ("drained", "already_drained")
#: as watchd.store.intents.Intents.unaudited: finished (not abandoned), no audit record of it since decided
UNAUDITED = (
    "SELECT key FROM intents i WHERE finished_at IS NOT NULL AND outcome != 'abandoned' AND NOT EXISTS"
    " (SELECT 1 FROM audit a WHERE a.node = i.node AND (a.action = i.kind OR a.event_id LIKE 'held-%')"
    " AND a.event_id IN (i.event_id, i.key) AND a.time >= i.decided_at)"
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
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
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


def _engine(tmp: Path, pg: PostgresServer, db: str, nodes: int, knobs: dict[str, str]) -> Daemon:
    slurm, env = fake_slurm(tmp, pool=f"gpu-[1-{nodes}]")
    env.update(knobs)
    state = {"kind": "postgres", "postgres": {"dsn": pg.dsn(db), "password_file": str(pg.password_file)}}
    return start_engine(tmp, mode="enforce", rules=DRAIN_ONLY, fake=slurm, env=env, state=state)


@dataclass
class Verdict:
    answered: int
    lost: list[str]  # answered 200, never drained at the scheduler
    twice: list[str]  # drained more than once at the scheduler
    audits: dict[str, int]  # node -> audit records saying it was taken out (want exactly 1)
    unfinished: list[str]
    unaudited: list[str]
    other_audits: dict[str, int]  # outcome -> count of the drain records that are not "took it out"

    def ok(self) -> bool:
        wrong = [n for n, c in self.audits.items() if c != 1]
        return not (self.lost or self.twice or wrong or self.unfinished or self.unaudited)


def _verdict(tmp: Path, pg: PostgresServer, db: str, answered: set[str]) -> Verdict:
    drains = [c for c in scheduler_calls(tmp) if c["call"] == "drain" and c["phase"] == "done"]
    at_scheduler: dict[str, int] = {}
    for call in drains:
        for node in call["nodes"]:
            at_scheduler[node] = at_scheduler.get(node, 0) + 1
    audit = _rows(pg, db, "SELECT node, outcome FROM audit WHERE action = 'drain'")
    took_out: dict[str, int] = {n: 0 for n in answered}
    other: dict[str, int] = {}
    for node, outcome in audit:
        if outcome in TOOK_OUT:
            took_out[node] = took_out.get(node, 0) + 1
        else:
            other[outcome] = other.get(outcome, 0) + 1
    return Verdict(
        answered=len(answered),
        lost=sorted(n for n in answered if at_scheduler.get(n, 0) == 0),
        twice=sorted(n for n, c in at_scheduler.items() if c > 1),
        audits=took_out,
        unfinished=[r[0] for r in _rows(pg, db, "SELECT key FROM intents WHERE finished_at IS NULL")],
        unaudited=[r[0] for r in _rows(pg, db, UNAUDITED)],
        other_audits=other,
    )


def _settle(tmp: Path, pg: PostgresServer, db: str, answered: set[str], timeout: float) -> Verdict:
    """Wait (bounded) for every drain answered 200 to be done and audited; the verdict either way."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(psycopg.Error):
            verdict = _verdict(tmp, pg, db, answered)
            if verdict.ok() or time.monotonic() > deadline:
                time.sleep(0.5)  # anything done twice would show now
                return _verdict(tmp, pg, db, answered)
        time.sleep(0.25)


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
) -> tuple[Verdict, Burst, int]:
    """Start an engine, send the burst, inject ``fault`` meanwhile (in this thread), wait for the drains
    answered 200 to settle; the verdict, the burst, the engine's error lines."""
    db = db or pg.create_database()
    engine = _engine(tmp, pg, db, nodes, knobs or {})
    try:
        burst = Burst(engine, [f"gpu-{i}" for i in range(1, nodes + 1)], spread_s=spread_s)
        sender = threading.Thread(target=burst.run)
        sender.start()
        fault(burst)
        sender.join(120)
        verdict = _settle(tmp, pg, db, burst.answered, timeout=60)
        assert engine.proc.poll() is None, engine.log()
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
    wrong = {n: c for n, c in verdict.audits.items() if c != 1}
    return (
        f"answered 200: {verdict.answered} (refused and re-sent: {burst.refused}); "
        f"lost: {len(verdict.lost)} {verdict.lost[:10]}; drained twice: {verdict.twice[:10]}; "
        f"audited as done != 1: {len(wrong)} {dict(list(wrong.items())[:10])}; "
        f"unfinished intents: {verdict.unfinished[:10]}; unaudited: {verdict.unaudited[:10]}; "
        f"other drain records: {verdict.other_audits}; error lines: {errors}"
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
        verdict, burst, errors = _during_burst(tmp, pg, 200, kill_sessions, spread_s=6.0)
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
    verdict, burst, errors = _during_burst(tmp_path, pg, 120, disk_full, spread_s=3.0, knobs=knobs, db=db)
    print(_report(verdict, burst, errors))
    assert verdict.answered == 120
    assert verdict.ok(), _report(verdict, burst, errors)
