"""Issue 16 item 12: what operators meet: a non-UTF-8 rule file named in the error (check, start, reload), a
dangling ``*.yaml`` link reported, the agent's retry delay never above ``backoff_max_s``, repeated log lines
(``event_time_in_future``, the per-action info line) aggregated instead of one line per event."""

from __future__ import annotations

import http.server
import itertools
import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.daemons import Daemon, agent_config, free_port, watchd_command
from tests.fault.common import RULES, actions, full_log, post_events, start_engine, xid

pytestmark = pytest.mark.real

BAD_BYTES = b"rules:\n  - name: caf\xe9-\xff\n    match: {kind: xid, xid: 79}\n    actions: [drain]\n"


def _check(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*watchd_command(), "rules", "check", *map(str, paths)], capture_output=True, text=True, timeout=30
    )


def test_non_utf8_rule_file_named_by_rules_check(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(BAD_BYTES)
    result = _check(bad)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr[-1500:]
    assert str(bad) in result.stdout + result.stderr


def test_non_utf8_rule_file_named_on_reload(tmp_path: Path) -> None:
    engine = start_engine(tmp_path, mode="dry-run")
    try:
        rules = Path(yaml.safe_load(engine.config_path.read_text())["rules"][0])
        rules.write_bytes(BAD_BYTES)
        engine.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "reload" not in full_log(engine):
            time.sleep(0.1)
        time.sleep(0.3)
        failures = [ln for ln in full_log(engine).splitlines() if "reload" in ln and "fail" in ln]
        assert failures, full_log(engine)[-1500:]
        assert any(str(rules) in ln for ln in failures), failures
        assert "Traceback" not in full_log(engine)
    finally:
        engine.stop()


def test_dangling_yaml_link_reported(tmp_path: Path) -> None:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "ok.yaml").write_text(RULES)
    (folder / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
    result = _check(folder)
    assert "gone.yaml" in result.stdout + result.stderr, result.stdout + result.stderr


def test_dangling_yaml_link_refused_on_hot_reload(tmp_path: Path) -> None:
    """A link to nothing added to a watched rules folder: was never noticed (no reload, no line, the
    metric 1) while ``watchd rules check`` refused the folder; now the reload is refused the same way: the
    old rules stay and act, the line names the link, the failure is counted."""
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "ok.yaml").write_text(RULES)
    engine = start_engine(
        tmp_path, mode="dry-run", rule_paths=[folder], reload={"watch_files": True, "poll_interval_s": 0.2}
    )
    try:
        (folder / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "rules_reload_failed" not in full_log(engine):
            time.sleep(0.1)
        failed = [ln for ln in full_log(engine).splitlines() if "rules_reload_failed" in ln]
        assert failed and "gone.yaml" in failed[0] and "dangling link" in failed[0], full_log(engine)[-1500:]
        assert "gone.yaml" in _check(folder).stdout  # what rules check says of the same folder
        metrics = engine.get("/metrics")
        assert "watchd_rules_reload_failures_total 1.0" in metrics
        assert "watchd_rules_last_reload_successful 0.0" in metrics and "watchd_rules_loaded 1.0" in metrics
        assert post_events(engine, [xid("gpu-3")])[0] == 200  # the old rule still drains (dry-run)
        assert any(a["action"] == "drain" and a["node"] == "gpu-3" for a in actions(engine))
    finally:
        engine.stop()


class _Always503(http.server.BaseHTTPRequestHandler):
    arrivals: list[float] = []

    def do_POST(self) -> None:
        self.arrivals.append(time.monotonic())
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_agent_retry_delay_never_above_backoff_max(tmp_path: Path) -> None:
    port = free_port()
    handler = type("Handler", (_Always503,), {"arrivals": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "token").write_text("t")
    log = tmp_path / "kern.log"
    log.write_text("")
    config = agent_config("gpu-1", port, tmp_path / "token", log)
    config["shipper"] = {"backoff_initial_s": 0.1, "backoff_max_s": 0.4}
    agent = Daemon("agent", config, tmp_path)
    try:
        agent.wait_ready()
        with open(log, "a") as f:
            f.write("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus.\n")
        time.sleep(7.0)
    finally:
        agent.stop(timeout=10)
        server.shutdown()
    arrivals = handler.arrivals
    assert len(arrivals) >= 8, f"only {len(arrivals)} attempts"
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert max(gaps) <= 0.4 + 0.08, f"retry delays up to {max(gaps):.2f}s with backoff_max_s 0.4: {gaps}"


def test_repeated_log_lines_are_aggregated(tmp_path: Path) -> None:
    """300 events stamped an hour ahead and 300 Xid 79 on 300 nodes (dry-run): the log carries a bounded
    number of ``event_time_in_future`` and ``action`` lines, plus summaries that count what was suppressed."""
    engine = start_engine(tmp_path, mode="dry-run")
    try:
        future = [xid(f"f{i}", code=13) for i in range(300)]
        future = [type(e)(e.id, e.node, e.source, e.kind, time.time() + 3600, e.attrs) for e in future]
        assert post_events(engine, future)[0] == 200
        for start in range(0, 300, 100):
            assert post_events(engine, [xid(f"a{i}") for i in range(start, start + 100)])[0] == 200
        time.sleep(0.5)
    finally:
        engine.stop()
    lines = [json.loads(ln) for ln in full_log(engine).splitlines() if ln.startswith("{")]
    future_lines = [ln for ln in lines if ln.get("event") == "event_time_in_future"]
    action_lines = [ln for ln in lines if ln.get("event") == "action"]
    summaries = [ln for ln in lines if ln.get("event") == "log_lines_suppressed"]
    assert len(future_lines) <= 50, f"{len(future_lines)} event_time_in_future lines for 300 events"
    assert len(action_lines) <= 50, f"{len(action_lines)} action lines for 600 actions"
    suppressed = {s["suppressed_event"]: s["suppressed"] for s in summaries}
    assert suppressed.get("event_time_in_future", 0) + len(future_lines) == 300, summaries
    assert suppressed.get("action", 0) + len(action_lines) == 600, summaries
