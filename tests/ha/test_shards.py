"""Two shards on one real PostgreSQL server (docs/scale.md, "Beyond one engine: shards"): two real engines,
each with its own database and its own lease, both leaders at once; an Xid sent to a shard's engine for one
of its nodes is decided by that shard, and the other shard's audit trail has no record of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.daemons import Daemon, engine_config, free_port
from tests.ha.pair import RULES, TOKEN, request, xid
from tests.harness.postgres import PostgresServer
from tests.support import wait_for
from watchd.model.events import batch_to_wire

pytestmark = pytest.mark.real

NODES = {"shard-1": ["gpu-1", "gpu-2"], "shard-2": ["gpu-3", "gpu-4"]}


def rows(pg: PostgresServer, db: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg.dsn_with_password(db), autocommit=True) as conn:
        return list(conn.execute(sql).fetchall())  # type: ignore[call-overload]


def test_two_shards_lead_at_once_and_decide_only_their_own(pg_server: PostgresServer, tmp_path: Path) -> None:
    token, rules = tmp_path / "token", tmp_path / "rules.yaml"
    token.write_text(TOKEN)
    rules.write_text(RULES)
    engines: dict[str, Daemon] = {}
    dbs: dict[str, str] = {}
    try:
        for lease, nodes in NODES.items():
            dbs[lease] = pg_server.create_database()
            config = engine_config(free_port(), token, "enforce", None)
            config.update(rules=[str(rules)], default_rules=False, reload={"watch_files": False})
            config["fake"] = {"enabled": True, "nodes": nodes}
            config["state"] = {
                "kind": "postgres",
                "postgres": {
                    "dsn": pg_server.dsn(dbs[lease]),
                    "password_file": str(pg_server.password_file),
                    "leader_election": {
                        "enabled": True,
                        "lease_name": lease,
                        "identity": f"{lease}-engine",
                        "lease_duration_s": 3.0,
                        "renew_deadline_s": 2.0,
                        "retry_period_s": 0.5,
                    },
                },
            }
            work = tmp_path / lease
            work.mkdir()
            engines[lease] = Daemon("engine", config, work)
        for engine in engines.values():
            engine.wait_ready()

        def leading() -> bool:
            return all(request(e.url, "GET", "/readyz", timeout=2)[0] == 200 for e in engines.values())

        wait_for(leading, 30, "both shards leading")
        for lease in NODES:  # each database: one lease, its own, held by its engine
            assert [r[:2] for r in rows(pg_server, dbs[lease], "SELECT name, holder FROM leader_lease")] == [
                (lease, f"{lease}-engine")
            ]
        sent = {}
        for lease, nodes in NODES.items():
            event = xid(nodes[0])
            assert (
                request(
                    engines[lease].url,
                    "POST",
                    "/api/v1/events",
                    json.dumps(batch_to_wire(event.node, [event])).encode(),
                    timeout=15,
                )[0]
                == 200
            )
            sent[lease] = event
        assert leading()  # still both leaders, at once
        for lease, event in sent.items():
            wait_for(
                lambda lease=lease, event=event: rows(
                    pg_server,
                    dbs[lease],
                    f"SELECT node FROM audit WHERE action = 'drain' AND event_id = '{event.id}'",
                ),
                30,
                f"{lease} drains {event.node}",
            )
        for lease, nodes in NODES.items():
            audit = rows(pg_server, dbs[lease], "SELECT event_id, node FROM audit")
            others = {e.id for other, e in sent.items() if other != lease}
            assert not [r for r in audit if r[0] in others or r[1] not in nodes], (lease, audit)
    finally:
        for engine in engines.values():
            engine.stop()
