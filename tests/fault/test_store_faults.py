"""Issue 16 items 1-3 and the locked database: the state store failing in each way (encoding, read-only, full
disk, locked) against real ``watchd engine`` processes (and a real ``watchd agent`` for the full disk), over
loopback HTTP. What must hold: a failure costs only itself — no node blocked, no decision silently lost, the
engine says it cannot record (503 / not ready) instead of answering 200."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import Daemon, agent_config, watchd_command
from tests.fault.common import (
    actions,
    db_audit,
    fake_slurm,
    post_events,
    post_json_text,
    request,
    scheduler_calls,
    start_engine,
    tracebacks,
    unfinished_intents,
    xid,
)
from tests.support import real_components_required, wait_for

pytestmark = pytest.mark.real

XID79_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def _surrogate_body(node_json: str, pci_json: str, event_id: str) -> str:
    """A batch as JSON text, so that it can carry a lone-surrogate escape (json.dumps never writes one)."""
    event = (
        f'{{"id": "{event_id}", "node": {node_json}, "source": "kmsg", "kind": "xid", "time": {time.time()}, '
        f'"attrs": {{"xid": 79, "pci_bus_id": {pci_json}, "meaning": "GPU has fallen off the bus"}}}}'
    )
    return f'{{"version": 1, "node": {node_json}, "events": [{event}]}}'


def test_surrogate_in_pci_bus_id_then_clean_xid_still_drains(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    slurm, env = fake_slurm(tmp_path)
    engine = start_engine(tmp_path, mode="enforce", db=db, fake=slurm, env=env)
    try:
        status, _ = post_json_text(engine, _surrogate_body('"gpu-2"', '"0000:3b:00.0\\udc80"', "bad-1"))
        assert status in (200, 400)
        status, body = post_events(engine, [xid("gpu-2")])
        assert status == 200, body
        wait_for(
            lambda: [a for a in actions(engine) if a["node"] == "gpu-2" and a["outcome"] == "drained"],
            5,
            "gpu-2 drained by the clean Xid 79",
        )
        assert tracebacks(engine) == 0, engine.log()
    finally:
        engine.stop()
    engine = start_engine(tmp_path, mode="enforce", db=db, fake=slurm, env=env)
    try:
        time.sleep(1.0)  # a restart re-drives what is unfinished
        assert unfinished_intents(db) == [], "an unfinished intent blocks its node"
        status, body = post_events(engine, [xid("gpu-2")])
        assert status == 200, body
        drains = [c for c in scheduler_calls(tmp_path) if c["call"] == "drain" and c["phase"] == "done"]
        assert [c for c in drains if "gpu-2" in c["nodes"]], "gpu-2 was never drained at the scheduler"
        assert tracebacks(engine) == 0, engine.log()
    finally:
        engine.stop()


def test_surrogate_in_node_name_is_refused_or_audited(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    engine = start_engine(tmp_path, mode="dry-run", db=db)
    try:
        status, reply = post_json_text(engine, _surrogate_body('"gpu-3\\udc80"', '"0000:3b:00.0"', "bad-2"))
        if status == 200 and not (isinstance(reply, dict) and reply.get("invalid")):
            wait_for(
                lambda: [a for a in db_audit(db) if a["event_id"] == "bad-2"],
                5,
                "an audit record of the accepted event",
            )
        else:
            assert status == 400, reply
        assert tracebacks(engine) == 0, engine.log()
    finally:
        engine.stop()


# ------------------------------------------------------------------------------------------------- read-only


def _unprivileged_engine(tmp: Path, db: Path) -> Daemon:
    """The engine as root without CAP_DAC_OVERRIDE (setpriv), so a 0444 file is read-only to it as it is to
    any non-root service user."""
    engine = start_engine(tmp, mode="dry-run", db=db, wait=False)
    engine.proc.kill()
    engine.proc.wait()
    engine._log.close()
    engine._log = open(engine.log_path, "wb")  # noqa: SIM115 - closed in stop()
    engine.proc = subprocess.Popen(
        [
            "setpriv",
            "--bounding-set",
            "-dac_override,-dac_read_search",
            "--inh-caps",
            "-dac_override,-dac_read_search",
            *watchd_command(),
            "engine",
            "--config",
            str(engine.config_path),
        ],
        stdout=engine._log,
        stderr=subprocess.STDOUT,
    )
    return engine


def test_read_only_state_database_refused_or_unhealthy(tmp_path: Path) -> None:
    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        if real_components_required():
            pytest.fail("setpriv (util-linux) required under CI")
        pytest.skip("setpriv not available: cannot drop CAP_DAC_OVERRIDE")
    db = tmp_path / "state.db"
    start_engine(tmp_path, mode="dry-run", db=db).stop()  # create it
    for p in tmp_path.glob("state.db*"):
        p.chmod(0o444)
    # as root, 0444 binds only without CAP_DAC_OVERRIDE; any other user meets the mode as it is
    engine = (
        _unprivileged_engine(tmp_path, db)
        if root
        else start_engine(tmp_path, mode="dry-run", db=db, wait=False)
    )
    try:
        deadline = time.monotonic() + 15
        verdict = None
        while time.monotonic() < deadline and verdict is None:
            if engine.proc.poll() is not None:
                verdict = "exited"
                break
            try:
                h, _ = request(engine.url, "GET", "/healthz", timeout=1)
                r, _ = request(engine.url, "GET", "/readyz", timeout=1)
                verdict = "up" if h == 200 and r == 200 else "unhealthy"
            except OSError:
                time.sleep(0.1)
        if verdict == "exited":
            assert engine.proc.returncode != 0
            assert str(db) in engine.log(), "the refusal must name the database"
            return
        assert verdict == "unhealthy", f"read-only database accepted: healthz and readyz 200 ({verdict})"
    finally:
        engine.stop()


# ------------------------------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs for the state database; unmounted at teardown. Skips only where mount is impossible
    (not root, no tmpfs), and under CI fails instead."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if result.returncode != 0:
        why = f"cannot mount a tmpfs: {result.stderr.strip()}"
        if real_components_required():
            pytest.fail(why)
        pytest.skip(why)
    try:
        yield mnt
    finally:
        for _ in range(20):
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)


def _fill(mnt: Path) -> Path:
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    return filler


def test_full_disk_answers_503_and_reports_not_ready(tmp_path: Path, small_disk: Path) -> None:
    db = small_disk / "state.db"
    engine = start_engine(tmp_path, mode="dry-run", db=db)
    try:
        _fill(small_disk)
        status, body = post_events(engine, [xid("gpu-1")])
        assert status == 503, f"full disk answered {status}: {body}"
        ready, _ = request(engine.url, "GET", "/readyz")
        assert ready == 503
    finally:
        engine.stop()


def test_full_disk_agent_keeps_batch_and_nothing_lost_when_space_returns(
    tmp_path: Path, small_disk: Path
) -> None:
    db = small_disk / "state.db"
    engine = start_engine(tmp_path, mode="dry-run", db=db)
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    agent = Daemon("agent", agent_config("gpu-4", engine.port, tmp_path / "token", kernel_log), tmp_path)
    try:
        agent.wait_ready()
        filler = _fill(small_disk)
        with open(kernel_log, "a") as f:
            f.write(XID79_LINE + "\n")
        time.sleep(2.0)
        filler.unlink()
        wait_for(
            lambda: [a for a in db_audit(db) if a["node"] == "gpu-4" and a["action"] == "drain"],
            10,
            "the drain of gpu-4 audited once space returned",
        )
        assert unfinished_intents(db) == []
    finally:
        agent.stop()
        engine.stop()


# ---------------------------------------------------------------------------------------------------- locked

_LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


def _lock(db: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(db), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_locked_database_loses_no_decision(tmp_path: Path) -> None:
    """Another process holds the write lock longer than the busy timeout (6 s): the decision made meanwhile
    is recorded once the lock goes, or refused (not 200) so the agent re-sends it: never lost."""
    db = tmp_path / "state.db"
    engine = start_engine(tmp_path, mode="dry-run", db=db)
    try:
        locker = _lock(db, 6.0)
        event = xid("gpu-1")
        status, _ = post_events(engine, [event], timeout=30)
        locker.wait(15)
        if status != 200:  # as the agent does
            status, body = post_events(engine, [event])
            assert status == 200, body
        wait_for(
            lambda: [a for a in db_audit(db) if a["node"] == "gpu-1" and a["action"] == "drain"],
            10,
            "the drain decided while the database was locked",
        )
        assert unfinished_intents(db) == []
    finally:
        engine.stop()


def test_locked_database_does_not_block_the_event_loop(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    engine = start_engine(tmp_path, mode="dry-run", db=db)
    try:
        locker = _lock(db, 4.0)
        sender = threading.Thread(target=post_events, args=(engine, [xid("gpu-1")], 30), daemon=True)
        sender.start()
        time.sleep(0.3)
        worst = 0.0
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            t0 = time.monotonic()
            request(engine.url, "GET", "/healthz", timeout=10)
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.05)
        locker.wait(15)
        sender.join(30)
        assert worst < 0.5, f"/healthz took {worst:.2f}s while another process held the write lock"
    finally:
        engine.stop()
