"""Two real ``watchd engine`` processes sharing one real PostgreSQL (issue 22), for the HA tests and the
failover benchmark: start them, find the leader, deliver batches as an agent behind a load balancer would
(to the ready engine; a refused or unanswered batch is sent again until one takes it), read the shared state.
"""

from __future__ import annotations

import http.client
import json
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from tests.daemons import Daemon, engine_config, free_port
from tests.harness.postgres import PostgresServer
from watchd.model.events import Event, batch_to_wire

TOKEN = "ha-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

#: a fatal Xid drains; an application Xid twice on one node within an hour drains too (rule memory)
RULES = """
rules:
  - name: fatal-xid
    severity: critical
    match: {kind: xid, xid: 79}
    actions:
      - drain: {reason: "Xid {{ xid }} GPU {{ pci_bus_id }}"}
  - name: app-xid-twice
    severity: warning
    match: {kind: xid, xid: 13}
    group_by: [node]
    count: 2
    window: 1h
    actions:
      - drain: {reason: "application Xid 13 twice in an hour"}
"""


def xid(node: str, code: int = 79) -> Event:
    attrs: dict[str, Any] = {"xid": code, "pci_bus_id": "0000:3b:00.0", "meaning": "test"}
    return Event(id=uuid.uuid4().hex, node=node, source="kmsg", kind="xid", time=time.time(), attrs=attrs)


def request(
    url: str, method: str, path: str, body: bytes | None = None, timeout: float = 10.0
) -> tuple[int, bytes]:
    host, _, port = url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=AUTH)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class HaPair:
    """Engines ``a`` and ``b`` on one database; :meth:`restart` replaces a killed one (same config)."""

    def __init__(
        self,
        pg: PostgresServer,
        tmp: Path,
        *,
        slurm_conf: str | None,
        lease_s: float = 3.0,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.pg = pg
        self.dsn = pg.dsn(pg.create_database())
        self.tmp = tmp
        token = tmp / "token"
        token.write_text(TOKEN)
        rules = tmp / "rules.yaml"
        rules.write_text(RULES)
        self.configs: dict[str, dict[str, Any]] = {}
        for name in ("a", "b"):
            config = engine_config(free_port(), token, "enforce", slurm_conf)
            config["rules"] = [str(rules)]
            config["default_rules"] = False
            config["reload"] = {"watch_files": False}
            config["state"] = {
                "kind": "postgres",
                "rules_snapshot_s": 0.5,
                "postgres": {
                    "dsn": self.dsn,
                    "password_file": str(pg.password_file),
                    "leader_election": {
                        "enabled": True,
                        "identity": f"engine-{name}",
                        "lease_duration_s": lease_s,
                        "renew_deadline_s": lease_s * 2 / 3,
                        "retry_period_s": lease_s / 6,
                    },
                },
            }
            for key, value in (extra or {}).items():
                config[key] = value
            self.configs[name] = config
        self.engines: dict[str, Daemon] = {}

    def start(self, name: str) -> Daemon:
        engine = Daemon("engine", self.configs[name], self.tmp)
        engine.wait_ready()
        self.engines[name] = engine
        return engine

    def restart(self, name: str) -> Daemon:
        old = self.engines.get(name)
        if old is not None:
            old.stop()
        return self.start(name)

    def ready(self, engine: Daemon) -> bool:
        try:
            return request(engine.url, "GET", "/readyz", timeout=2)[0] == 200
        except OSError:
            return False

    def leader(self, timeout: float = 30.0) -> tuple[str, Daemon]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, engine in self.engines.items():
                if engine.proc.poll() is None and self.ready(engine):
                    return name, engine
            time.sleep(0.05)
        logs = "\n".join(f"--- {n}\n{e.log()}" for n, e in self.engines.items())
        raise AssertionError(f"no leader in {timeout}s\n{logs}")

    def post(self, engine: Daemon, events: list[Event], timeout: float = 15.0) -> int:
        body = json.dumps(batch_to_wire(events[0].node, events)).encode()
        try:
            return request(engine.url, "POST", "/api/v1/events", body, timeout)[0]
        except OSError:
            return 0

    def deliver(self, events: list[Event], timeout: float = 60.0) -> str:
        """Send the batch until an engine takes it (200), the ready one first; the name of that engine."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [(n, e) for n, e in self.engines.items() if e.proc.poll() is None]
            live.sort(key=lambda ne: not self.ready(ne[1]))
            for name, engine in live:
                if self.post(engine, events) == 200:
                    return name
            time.sleep(0.1)
        raise AssertionError(f"batch for {events[0].node} not taken in {timeout}s")

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, password=self.pg.password, autocommit=True) as conn:
            return list(conn.execute(sql, args).fetchall())  # type: ignore[call-overload]

    def stop(self) -> None:
        for engine in self.engines.values():
            engine.stop()
