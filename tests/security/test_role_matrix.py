"""Who may do what, as one table (docs/security.md, *The engine's API*): every credential configuration of
``auth:`` against every kind of request and every caller, over real HTTP against a real ``watchd engine``
process. A row is a configuration and a request; a column is who calls: no token, a wrong token, the agents'
shared token, an operator's, a viewer's. Each cell is the status the engine must answer: the request's own
answer where the caller may (200; 404 for an operator's call on a held action that does not exist and for a
job the engine has no advice for: the request went through), 401 for a token the engine does not know, 403
for one it knows that may not do this. A viewer (or an operator) never ingests nor asks for an agent's
commands: those are the agents' alone, and an engine with operators or viewers but no agents' token is
refused at start."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon, engine_config, free_port
from tests.fault.common import RULES, request

pytestmark = pytest.mark.real

AGENT, OPERATOR, VIEWER = "agent-token-1", "operator-token-1", "viewer-token-1"
ALICE = {"name": "alice", "token": OPERATOR}
GRAFANA = {"name": "grafana", "token": VIEWER}
CALLERS: dict[str, str | None] = {
    "none": None,
    "wrong": "nobody-knows-me",
    "agent": AGENT,
    "operator": OPERATOR,
    "viewer": VIEWER,
}

#: configuration name -> the ``auth:`` section (None: no ``auth:`` at all)
CONFIGS: dict[str, dict[str, Any] | None] = {
    "open": None,
    "shared": {"token": AGENT},
    "roles": {
        "token": AGENT,
        "operators": [ALICE],
        "viewers": [GRAFANA],
    },
    "shared+viewers": {"token": AGENT, "viewers": [GRAFANA]},
    "shared+operators": {"token": AGENT, "operators": [ALICE]},
    "roles, closed": {
        "token": AGENT,
        "operators": [ALICE],
        "viewers": [GRAFANA],
        "open_metrics": False,
        "open_health": False,
    },
}

# config            request      none wrong agent operator viewer
TABLE = """
open                ingest       200  200   200   200      200
open                read         200  200   200   200      200
open                operate      404  404   404   404      404
open                agent_read   404  404   404   404      404
open                agent        200  200   200   200      200
open                metrics      200  200   200   200      200
open                health       200  200   200   200      200
shared              ingest       401  401   200   401      401
shared              read         401  401   200   401      401
shared              operate      401  401   404   401      401
shared              agent_read   401  401   404   401      401
shared              agent        401  401   200   401      401
shared              metrics      200  200   200   200      200
shared              health       200  200   200   200      200
roles               ingest       401  401   200   403      403
roles               read         401  401   403   200      200
roles               operate      401  401   403   404      403
roles               agent_read   401  401   404   404      404
roles               agent        401  401   200   403      403
roles               metrics      200  200   200   200      200
roles               health       200  200   200   200      200
shared+viewers      ingest       401  401   200   401      403
shared+viewers      read         401  401   403   401      200
shared+viewers      operate      401  401   403   401      403
shared+viewers      agent_read   401  401   404   401      404
shared+viewers      agent        401  401   200   401      403
shared+operators    ingest       401  401   200   403      401
shared+operators    read         401  401   403   200      401
shared+operators    operate      401  401   403   404      401
shared+operators    agent_read   401  401   404   404      401
shared+operators    agent        401  401   200   403      401
roles, closed       metrics      401  401   403   200      200
roles, closed       health       401  401   403   200      200
"""


def _rows() -> dict[str, dict[str, dict[str, int]]]:
    """config -> request -> caller -> status, from :data:`TABLE`."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for line in TABLE.strip().splitlines():
        *name, need, a, b, c, d, e = line.split()
        statuses = dict(zip(CALLERS, map(int, (a, b, c, d, e)), strict=True))
        out.setdefault(" ".join(name), {})[need] = statuses
    return out


ROWS = _rows()


def _batch() -> bytes:
    event = {
        "id": uuid.uuid4().hex,
        "node": "gpu-9",
        "source": "kmsg",
        "kind": "xid",
        "time": time.time(),
        "attrs": {"xid": 13, "pci_bus_id": "0000:3b:00.0", "meaning": "Graphics Engine Exception"},
    }
    return json.dumps({"version": 1, "node": "gpu-9", "events": [event]}).encode()


#: request -> (method, path); ingest's body is a fresh valid batch each time (never a duplicate)
REQUESTS: dict[str, tuple[str, str]] = {
    "ingest": ("POST", "/api/v1/events"),
    "read": ("GET", "/api/v1/status"),
    "operate": ("POST", "/api/v1/held/987654/discard"),  # nothing held: 404 once allowed, nothing changes
    "agent_read": ("GET", "/api/v1/reliability/job?job=slurm:42"),  # no heartbeats of it: 404 once allowed
    "agent": ("GET", "/api/v1/agent/commands?node=gpu-9&instance=i1"),  # an agent's own call: its commands
    "metrics": ("GET", "/metrics"),
    "health": ("GET", "/healthz"),
}


def _start(tmp: Path, auth: dict[str, Any] | None, *, wait: bool = True) -> Daemon:
    token = tmp / "token"
    token.write_text(AGENT)
    config = engine_config(free_port(), token, "dry-run", None)
    rules = tmp / "rules.yaml"
    rules.write_text(RULES)
    config.update(rules=[str(rules)], default_rules=False, reload={"watch_files": False})
    if auth is None:
        del config["auth"]
    else:
        config["auth"] = auth
    engine = Daemon("engine", config, tmp)
    if wait:  # /healthz may need a credential here: an operator's token is one wherever operators are
        headers = {"Authorization": f"Bearer {OPERATOR if auth and auth.get('operators') else AGENT}"}
        deadline = time.monotonic() + 20
        while request_or_none(engine.url, headers) != 200:
            assert engine.proc.poll() is None and time.monotonic() < deadline, engine.log()
            time.sleep(0.05)
    return engine


def request_or_none(url: str, headers: dict[str, str]) -> int | None:
    try:
        return request(url, "GET", "/healthz", None, headers, timeout=1)[0]
    except OSError:
        return None


@pytest.mark.parametrize("name", list(ROWS))
def test_who_may_do_what(name: str, tmp_path: Path) -> None:
    engine = _start(tmp_path, CONFIGS[name])
    try:
        wrong: list[str] = []
        for need, expected in ROWS[name].items():
            method, path = REQUESTS[need]
            for caller, token in CALLERS.items():
                headers = {"Content-Type": "application/json"}
                if token is not None:
                    headers["Authorization"] = f"Bearer {token}"
                body = _batch() if need == "ingest" else (b"" if method == "POST" else None)
                status, raw = request(engine.url, method, path, body, headers)
                if status != expected[caller]:
                    wrong.append(f"{need} by {caller}: {status}, expected {expected[caller]} ({raw[:120]!r})")
        assert wrong == [], f"auth {name}:\n" + "\n".join(wrong)
    finally:
        engine.stop()


@pytest.mark.parametrize(
    "auth",
    [
        {"operators": [ALICE], "viewers": [GRAFANA]},
        {"viewers": [GRAFANA]},
        {"operators": [ALICE]},
    ],
    ids=["operators+viewers", "viewers", "operators"],
)
def test_roles_without_the_agents_token_are_refused_at_start(auth: dict[str, Any], tmp_path: Path) -> None:
    """Before: the engine started, and a viewer's token ingested (and so drained). No agent could send
    events with its own token anyway: a config error, exit 2, naming the key."""
    engine = _start(tmp_path, auth, wait=False)
    try:
        assert engine.proc.wait(20) == 2, engine.log()
        assert "auth" in engine.log() and "agents' token" in engine.log(), engine.log()
    finally:
        engine.stop()
