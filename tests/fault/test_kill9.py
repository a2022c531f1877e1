"""Issue 16 item 4: kill -9 at every step of an action's life, against a real ``watchd engine`` in enforce
mode with the fake scheduler (tests/fault/fake_slurm.py through ``slurm.scontrol``/``squeue``/``sinfo``)
and in dry-run. After each crash the engine is restarted on the same state database and the "agent" (this
test) re-sends what was not answered 200, as the real agent does. Then: every node's drain and requeue are
audited exactly once (0 lost, 0 doubled), the scheduler applied each at most once, and no intent is left
unfinished (no node blocked).

How each step is reached from outside the process:
- ``intent``: the fake ``scontrol update`` sleeps *before* touching anything (FAKE_SLURM_PRE_DELAY_S); the
  test waits until the database holds the unfinished intent, then kills the engine and its children (the
  scheduler never saw the drain).
- ``scheduler_call``: the fake logs ``start``, then sleeps (FAKE_SLURM_DELAY_S); the test kills engine and
  children once ``start`` is logged (the drain may or may not have been applied: here it was not).
- ``finish``: the fake applies the drain, logs ``done`` and SIGSTOPs its parent, the engine, before it reads
  the result (FAKE_SLURM_STOP_PARENT_AFTER); the test sees the engine stopped (state ``T``) and kills it.
- ``audit``: as ``finish``, then SIGCONT, and the test polls the database until the intent is finished and
  kills at once: the window between finishing the intent and appending the audit record (two separate
  commits) is hit by timing; whichever side of it the kill lands, the restart audits the drain once (a
  finished intent without its audit record is audited at start, marked as recovered).
- ``requeue_call``: as ``scheduler_call`` for the requeue that follows the drain.
- dry-run: kill at a sweep of delays after the post (0, 5, 30 ms).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fault.common import (
    crash,
    db_audit,
    fake_slurm,
    finished_intent,
    post_events,
    proc_state,
    scheduler_calls,
    start_engine,
    tracebacks,
    unfinished_intents,
    xid,
)
from tests.support import wait_for

pytestmark = pytest.mark.real


def _post_quietly(engine: Any, event: Any, out: dict[str, int]) -> None:
    try:
        out["status"], _ = post_events(engine, [event], timeout=20)
    except OSError:
        out["status"] = 0


def _settled(db: Path, node: str) -> bool:
    audit = db_audit(db)
    kinds = [a["action"] for a in audit if a["node"] == node]
    return "drain" in kinds and "requeue" in kinds and not unfinished_intents(db)


def _check(tmp: Path, db: Path, nodes: list[str], enforce: bool) -> None:
    audit = db_audit(db)
    # a re-sent event after a restart may add a "deduplicated" record: that is not a second decision
    decided = [a for a in audit if a["outcome"] != "deduplicated"]
    for node in nodes:
        drains = [a for a in decided if a["node"] == node and a["action"] == "drain"]
        requeues = [a for a in decided if a["node"] == node and a["action"] == "requeue"]
        assert len(drains) == 1, f"{node}: {len(drains)} drain audit records (want 1): {drains}"
        assert len(requeues) == 1, f"{node}: {len(requeues)} requeue audit records (want 1): {requeues}"
    assert unfinished_intents(db) == [], "an intent left unfinished blocks its node"
    if enforce:
        calls = scheduler_calls(tmp)
        for node in nodes:
            done = [c for c in calls if c["call"] == "drain" and c["phase"] == "done" and node in c["nodes"]]
            assert len(done) == 1, f"{node}: drained {len(done)} times at the scheduler (want 1)"
        requeued = [c for c in calls if c["call"] == "requeue" and c["phase"] == "done"]
        jobs = [j for c in requeued for j in c["jobs"]]
        assert len(jobs) == len(set(jobs)), f"a job requeued twice: {jobs}"


def _round(tmp: Path, step: str) -> None:
    db = tmp / "state.db"
    node = "gpu-1"
    slurm, env = fake_slurm(tmp)
    if step == "intent":
        env.update(FAKE_SLURM_PRE_DELAY_S="30", FAKE_SLURM_DELAY_ON="drain")
    elif step == "scheduler_call":
        env.update(FAKE_SLURM_DELAY_S="30", FAKE_SLURM_DELAY_ON="drain")
    elif step in ("finish", "audit"):
        env.update(FAKE_SLURM_STOP_PARENT_AFTER="drain")
    elif step == "requeue_call":
        env.update(FAKE_SLURM_DELAY_S="30", FAKE_SLURM_DELAY_ON="requeue")
    engine = start_engine(tmp, mode="enforce", db=db, fake=slurm, env=env)
    event = xid(node)
    reply: dict[str, int] = {}
    sender = threading.Thread(target=_post_quietly, args=(engine, event, reply), daemon=True)
    sender.start()
    pid = engine.proc.pid
    if step == "intent":
        wait_for(lambda: unfinished_intents(db), 10, "the intent")
        assert not [c for c in scheduler_calls(tmp) if c["call"] == "drain"]
        crash(engine)
    elif step in ("scheduler_call", "requeue_call"):
        call = "drain" if step == "scheduler_call" else "requeue"
        wait_for(lambda: [c for c in scheduler_calls(tmp) if c["call"] == call], 10, f"the {call} call")
        crash(engine)
    elif step == "finish":
        wait_for(lambda: proc_state(pid) == "T", 10, "the engine stopped by the scheduler")
        crash(engine)
    elif step == "audit":
        wait_for(lambda: proc_state(pid) == "T", 10, "the engine stopped by the scheduler")
        os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while not finished_intent(db, f"drain:{node}") and time.monotonic() < deadline:
            pass
        crash(engine)
    sender.join(20)
    # the restarted engine: no delays, no stops; the agent re-sends what was not answered 200
    slurm, env = fake_slurm(tmp)
    again = start_engine(tmp, mode="enforce", db=db, fake=slurm, env=env)
    try:
        if reply.get("status") != 200:
            status, body = post_events(again, [event])
            assert status == 200, body
        wait_for(lambda: _settled(db, node), 15, f"{node} drained and requeued after the restart")
        time.sleep(0.3)  # anything doubled would show now
        _check(tmp, db, [node], enforce=True)
        assert tracebacks(again) == 0, again.log()
    finally:
        again.stop()


@pytest.mark.parametrize("step", ["intent", "scheduler_call", "finish", "requeue_call"])
def test_kill9_at_each_step_enforce_loses_and_doubles_nothing(tmp_path: Path, step: str) -> None:
    _round(tmp_path, step)


def test_kill9_between_finish_and_audit_enforce(tmp_path: Path) -> None:
    _round(tmp_path, "audit")


def test_kill9_sweep_dry_run(tmp_path: Path) -> None:
    """Dry-run: kill -9 at 0, 5 and 30 ms after the post, one node per round; each node audited exactly once
    (drain and requeue) after the restart and the agent's re-send."""
    db = tmp_path / "state.db"
    nodes: list[str] = []
    for i, delay in enumerate([0.0, 0.005, 0.03]):
        node = f"gpu-{i + 1}"
        nodes.append(node)
        engine = start_engine(tmp_path, mode="dry-run", db=db)
        event = xid(node)
        reply: dict[str, int] = {}
        sender = threading.Thread(target=_post_quietly, args=(engine, event, reply), daemon=True)
        sender.start()
        time.sleep(delay)
        crash(engine)
        sender.join(20)
        again = start_engine(tmp_path, mode="dry-run", db=db)
        try:
            if reply.get("status") != 200:
                status, body = post_events(again, [event])
                assert status == 200, body
            wait_for(lambda n=node: _settled(db, n), 15, f"{node} decided after the restart")
            assert tracebacks(again) == 0, again.log()
        finally:
            again.stop()
    _check(tmp_path, db, nodes, enforce=False)
