"""What the rules remember (count windows, for holds, unless sightings, cooldowns) survives a restart of the
engine, clean or ``kill -9``: saved in the state database as a snapshot, restored only into the same rule."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon, engine_config, free_port
from tests.support import wait_for
from watchd.model.events import INGEST_PATH, Event, batch_to_wire
from watchd.rules import RuleEngine, load_rules, parse_rule_file


def _rules() -> tuple[Any, ...]:
    from benchmarks.common import synthetic_rules_yaml

    pack = load_rules([])
    synthetic, problems = parse_rule_file(synthetic_rules_yaml(300), "<syn>", len(pack.rules))
    assert not problems
    return (*pack.rules, *synthetic)


def _through_json(snapshot: dict[str, Any]) -> dict[str, Any]:
    """As the engine saves and reads it back."""
    from watchd.rules.persist import state_to_data

    return {rule: (fp, json.loads(json.dumps(state_to_data(copy)))) for rule, (fp, copy) in snapshot.items()}


def test_a_restored_engine_decides_as_the_one_that_never_stopped() -> None:
    from benchmarks.common import make_events

    rules = _rules()
    events = make_events(6000, gpus=64, seed=11)
    before, after = events[:3000], events[3000:]
    running = RuleEngine(rules)
    for e in before:
        running.evaluate(e)
    snapshot = _through_json(running.snapshot())
    assert {"app-xid-repeated", "xid-45-alone"} <= set(snapshot)
    restarted, forgetful = RuleEngine(rules), RuleEngine(rules)
    restored, skipped = restarted.restore(snapshot)
    assert skipped == [] and sorted(restored) == sorted(snapshot)
    want = [running.evaluate(e) for e in after]
    assert [restarted.evaluate(e) for e in after] == want
    assert [forgetful.evaluate(e) for e in after] != want  # what the snapshot is for


def test_only_the_same_rule_gets_its_state_back() -> None:
    rules = _rules()
    by_name = {r.name: r for r in rules}
    engine = RuleEngine(rules)
    from benchmarks.common import make_events

    for e in make_events(2000, gpus=64, seed=3):
        engine.evaluate(e)
    snapshot = _through_json(engine.snapshot())
    changed = replace(
        by_name["app-xid-repeated"], spec=by_name["app-xid-repeated"].spec.model_copy(update={"count": 4})
    )
    others = tuple(r for r in rules if r.name not in ("app-xid-repeated", "xid-45-alone"))
    snapshot["xid-45-alone"] = (snapshot["xid-45-alone"][0], {"window": "not a list of groups"})
    fresh = RuleEngine((*others, changed, by_name["xid-45-alone"]))
    restored, skipped = fresh.restore({**snapshot, "retired-rule": ("x", {})})
    assert "app-xid-repeated" not in restored and "xid-45-alone" not in restored and restored
    assert "app-xid-repeated: the rule changed since it was saved" in skipped
    assert any(s.startswith("xid-45-alone: malformed rule state") for s in skipped), skipped
    assert "retired-rule: no such stateful rule now" in skipped


RULES = """
rules:
  - name: twice-in-28d
    match: {kind: xid, xid: 79}
    count: 2
    window: 28d
    actions:
      - log: {message: "Xid 79 on {{ node }} {{ count }} times"}
"""


def _post(engine: Daemon, token: str, event_id: str) -> None:
    event = Event(id=event_id, node="gpu-1", source="kmsg", kind="xid", time=time.time(), attrs={"xid": 79})
    request = urllib.request.Request(
        f"{engine.url}{INGEST_PATH}",
        data=json.dumps(batch_to_wire("gpu-1", [event])).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200


@pytest.mark.real
def test_a_count_window_survives_kill_9_and_a_clean_restart(tmp_path: Path) -> None:
    token = "rule-state-token"
    (tmp_path / "token").write_text(token)
    (tmp_path / "rules.yaml").write_text(RULES)
    config = engine_config(free_port(), tmp_path / "token", "dry-run", None)
    config["rules"] = [str(tmp_path / "rules.yaml")]
    config["state"] = {"path": str(tmp_path / "state.db"), "rules_snapshot_s": 0.2}

    def start() -> Daemon:
        engine = Daemon("engine", config, tmp_path)
        engine.wait_ready()
        return engine

    def fired(engine: Daemon) -> list[Any]:
        return [a for a in engine.get_json("/api/v1/actions")["actions"] if a["rule"] == "twice-in-28d"]

    engine = start()
    try:
        _post(engine, token, "first")
        time.sleep(0.6)  # a periodic snapshot or two
        engine.proc.send_signal(signal.SIGKILL)
        engine.proc.wait(10)
    finally:
        engine.stop()
    engine = start()
    try:
        _post(engine, token, "second")  # the count of 2 needs the first, seen before the kill
        wait_for(lambda: len(fired(engine)) == 1, what="the rule firing on the second event")
        assert fired(engine)[0]["detail"] == "Xid 79 on gpu-1 2 times"
        _post(engine, token, "third")  # the window restarted on firing: one more is 1 of 2
        assert engine.stop() == 0  # clean: the snapshot taken at shutdown holds the third
    finally:
        engine.stop()
    engine = start()
    try:
        _post(engine, token, "fourth")
        # the actions API reads the durable audit: the firing before the restart is listed too
        wait_for(lambda: len(fired(engine)) == 2, what="the rule firing again after a clean restart")
    finally:
        engine.stop()
