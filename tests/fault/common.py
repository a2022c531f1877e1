"""Black-box helpers of the fault suite: real ``watchd engine``/``watchd agent`` processes started from the
CLI (tests/daemons.py), raw HTTP on loopback, and the fake Slurm commands (fake_slurm.py) for enforce mode.
Only the CLI, the HTTP API, config files and the state database file are used: no internal module."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import sqlite3
import stat
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tests.daemons import Daemon, engine_config, free_port
from watchd.model.events import Event, batch_to_wire

TOKEN = "fault-token"
HERE = Path(__file__).resolve().parent
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

#: A fatal Xid drains and requeues; every other Xid only logs. Small and stable: the suite must not depend on
#: the shipped pack's wording.
RULES = """
rules:
  - name: fatal-xid
    severity: critical
    match: {kind: xid, xid: 79}
    actions:
      - drain: {reason: "Xid {{ xid }} GPU {{ pci_bus_id }}"}
      - requeue
"""


#: the nodes of the in-memory scheduler an engine started with ``everything`` has
NODES = ("gpu-1", "gpu-2")
#: the config that makes every endpoint of the engine answer: a scheduler (resume, validate, drains), the
#: checks (``/api/v1/checks``, ``checks/run``, ``nodes/{node}/validate``) with the fake runner
EVERYTHING: dict[str, Any] = {
    "fake": {"enabled": True, "nodes": list(NODES)},
    "checks": {
        "enabled": True,
        "runner": "fake",
        "items": [{"name": "nhc", "type": "command", "command": ["/bin/true"]}],
    },
    "drains": {"enabled": True},
}


def fake_slurm(
    tmp: Path, delay_s: float = 0.0, pool: str = "gpu-[1-4]"
) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``slurm:`` config section and the environment that make the engine call fake_slurm.py."""
    root = tmp / "fake-slurm"
    root.mkdir(exist_ok=True)
    tools: dict[str, str] = {}
    for tool in ("scontrol", "squeue", "sinfo"):
        wrapper = root / tool
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {HERE / "fake_slurm.py"} {tool} "$@"\n')
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        tools[tool] = str(wrapper)
    env = {"FAKE_SLURM_DIR": str(root), "FAKE_SLURM_DELAY_S": str(delay_s), "FAKE_SLURM_POOL": pool}
    return {"enabled": True, "timeout_s": 30, **tools}, env


def scheduler_calls(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "fake-slurm" / "calls.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_engine(
    tmp: Path,
    *,
    mode: str = "dry-run",
    rules: str = RULES,
    db: Path | None = None,
    fake: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    wait: bool = True,
    everything: bool = False,
    rule_paths: list[Path] | None = None,
    **extra: Any,
) -> Daemon:
    """A real engine on a free loopback port. ``fake``: the slurm section from :func:`fake_slurm` (and its
    ``env``). ``everything``: every endpoint answers (:data:`EVERYTHING`: the in-memory scheduler with
    :data:`NODES`, the checks with the fake runner, the drains view). ``rule_paths``: rule files or folders
    in place of ``rules``."""
    token = tmp / "token"
    token.write_text(TOKEN)
    rules_path = tmp / f"rules-{uuid.uuid4().hex[:6]}.yaml"
    rules_path.write_text(rules)
    config = engine_config(free_port(), token, mode, None)
    config["rules"] = [str(p) for p in rule_paths] if rule_paths is not None else [str(rules_path)]
    config["default_rules"] = False  # these rules alone
    config["reload"] = {"watch_files": False}
    if fake is not None:
        config["slurm"] = fake
        config["safety"] = {"max_fraction": 1.0, "max_nodes": 100_000, "pools_refresh_s": 3600}
    if db is not None:
        config["state"] = {"path": str(db)}
    if everything:
        config.update(EVERYTHING)
        config["checks"] = {**EVERYTHING["checks"], "output_dir": str(tmp / "checks-out")}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    engine = Daemon("engine", config, tmp, env=env)
    if wait:
        engine.wait_ready()
    return engine


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    """One raw HTTP request (any bytes, any headers); (status, body)."""
    host, _, port = url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in (headers or {}).items():
            conn.putheader(k, v.encode("latin-1") if isinstance(v, str) else v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def xid(node: str, code: int = 79, event_id: str | None = None, **attrs: Any) -> Event:
    base: dict[str, Any] = {
        "xid": code,
        "pci_bus_id": "0000:3b:00.0",
        "meaning": "GPU has fallen off the bus",
    }
    base.update(attrs)
    return Event(
        id=event_id or uuid.uuid4().hex, node=node, source="kmsg", kind="xid", time=time.time(), attrs=base
    )


def post_events(engine: Daemon, events: list[Event], timeout: float = 15.0) -> tuple[int, Any]:
    node = events[0].node if events else "n"
    body = json.dumps(batch_to_wire(node, events)).encode()
    status, raw = request(engine.url, "POST", "/api/v1/events", body, AUTH, timeout)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def post_json_text(engine: Daemon, text: str, timeout: float = 15.0) -> tuple[int, Any]:
    """POST a body given as JSON text (so it can carry escapes json.dumps would never write, like \\udc80)."""
    status, raw = request(engine.url, "POST", "/api/v1/events", text.encode(), AUTH, timeout)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def actions(engine: Daemon, limit: int = 10_000) -> list[dict[str, Any]]:
    status, raw = request(engine.url, "GET", f"/api/v1/actions?limit={limit}", headers=AUTH)
    assert status == 200, raw
    return list(json.loads(raw)["actions"])


def db_audit(db: Path) -> list[dict[str, Any]]:
    """The audit rows in the state database file, read-only (schema-agnostic: every column)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM audit")]
    finally:
        conn.close()


def tracebacks(daemon: Daemon) -> int:
    return daemon.log_path.read_text(errors="replace").count("Traceback")


def full_log(daemon: Daemon) -> str:
    return daemon.log_path.read_text(errors="replace")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def kill9(daemon: Daemon) -> None:
    if daemon.proc.poll() is None:
        os.kill(daemon.proc.pid, 9)
        daemon.proc.wait(10)
    daemon.stop()


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(k) for k in (t / "children").read_text().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def crash(daemon: Daemon) -> None:
    """kill -9 of the engine *and* of the commands it runs (the whole box dies): SIGSTOP first, so it cannot
    observe its children dying, then SIGKILL the children, then the engine."""
    pid = daemon.proc.pid
    if daemon.proc.poll() is None:
        os.kill(pid, 19)  # SIGSTOP
        for child in descendants(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, 9)
        os.kill(pid, 9)
        daemon.proc.wait(10)
    daemon.stop()


def proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def unfinished_intents(db: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return [(k, n) for k, n in conn.execute("SELECT key, node FROM intents WHERE finished_at IS NULL")]
    finally:
        conn.close()


def finished_intent(db: Path, key: str) -> bool:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = conn.execute(
            "SELECT 1 FROM intents WHERE key = ? AND finished_at IS NOT NULL LIMIT 1", (key,)
        ).fetchone()
        return row is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()
