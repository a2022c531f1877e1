"""The engine's status read model: what ``GET /api/v1/status`` (and ``watchd status``) shows, assembled from
the fleet state (nodes, jobs), the store (audit, held actions, breaker counts), the executor (mode, pools,
limits) and the alert sink. It only reads."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from watchd.actions.executor import ActionExecutor
from watchd.clock import Clock
from watchd.detect.correlator import Correlator
from watchd.detect.finding import Finding
from watchd.integrations.alertmanager.notifier import AlertmanagerNotifier
from watchd.store.database import Store

_INCIDENT_ACTIONS = ("drain", "requeue", "alert")  # what makes a node an incident in the status
NODES_LIMIT = 500  # nodes in one status document unless ?limit= says otherwise
HELD_LIMIT = 100  # held actions in it (the newest) unless ?held_limit=; GET /api/v1/held lists them all
TAKEN_OUT_LIMIT = 1000  # the newest nodes listed per pool of the breaker (taken_out_count counts all)


#: a count past this (SQLite's, PostgreSQL's largest integer) means "all" as much as this one does
_MAX_COUNT = 2**63 - 1


def _count(query: Mapping[str, str], name: str, default: int) -> int:
    """A non-negative integer query parameter, at most :data:`_MAX_COUNT` (the database takes no larger
    ``LIMIT``: was a 500 past 2^63); ValueError otherwise."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected a non-negative integer") from None
    if value < 0:
        raise ValueError(f"{name}: expected a non-negative integer")
    return min(value, _MAX_COUNT)


@dataclasses.dataclass(frozen=True, slots=True)
class EngineStatus:
    clock: Clock
    store: Store
    executor: ActionExecutor
    correlator: Correlator
    findings: Sequence[Finding]
    queue: asyncio.Queue[Any]
    rule_names: Callable[[], list[str]]  # the active rule set's (it changes on reload)
    scheduler: str | None
    alerts: AlertmanagerNotifier | None
    breaker_window_s: float

    def document(self, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The status document. Bounded whatever the fleet's size: at most ``limit`` nodes (troubled ones
        first: a lost GPU, a recent fault, an incident or a held action; ``nodes_total`` counts all that
        match) and the newest ``held_limit`` held actions (``held_total`` counts all). ``query`` (the HTTP
        query string): ``limit``, ``held_limit``, ``node`` (a name, or a prefix ending in ``*``).

        Raises ValueError for a query parameter that is not a non-negative integer where one is expected."""
        q = query or {}
        limit = _count(q, "limit", NODES_LIMIT)
        held_limit = _count(q, "held_limit", HELD_LIMIT)
        node_filter = q.get("node") or None
        now = self.clock.now()
        recent = self.recent_actions(200)
        incidents: dict[str, dict[str, Any]] = {}
        for a in recent:
            if a["action"] in _INCIDENT_ACTIONS and a["outcome"] != "deduplicated":
                node = incidents.setdefault(a["node"], {"node": a["node"], "actions": []})
                node["actions"].append({k: a[k] for k in ("time", "rule", "action", "outcome", "detail")})
        held_total = self.store.held.count()
        held = self.held(held_limit)
        held_by_node = self.store.held.count_by_node()  # one grouped count, no row read

        def troubled(name: str) -> bool:
            return name in incidents or name in held_by_node

        nodes, nodes_total = self.correlator.fleet.nodes(
            now, limit=limit, node=node_filter, troubled_first=troubled
        )
        for node in nodes:
            incident = incidents.get(node["node"])
            node["last_action"] = incident["actions"][-1] if incident else None
            node["held"] = held_by_node.get(node["node"], 0)
        return {
            "mode": self.executor.mode,
            "pid": os.getpid(),
            "nodes": nodes,
            "nodes_total": nodes_total,
            "nodes_omitted": nodes_total - len(nodes),
            "rules": self.rule_names(),
            "queue_depth": self.queue.qsize(),
            "scheduler": self.scheduler,
            "incidents": list(incidents.values()),
            "recent_actions": recent[-50:],
            "held": held,
            "held_total": held_total,
            "held_omitted": held_total - len(held),
            "jobs": self.correlator.last_cycle_jobs,
            "findings": [f.to_event().to_wire() for f in list(self.findings)[-50:]],
            "breaker": self.breaker(now),
            "alerts": self.alerts.state() if self.alerts is not None else [],
            "fleet": {
                "evicted": dict(self.correlator.fleet.evicted),
                "state_bytes": self.correlator.fleet.bytes,
                "max_state_bytes": self.correlator.fleet.max_bytes,
            },
        }

    def breaker(self, now: float) -> list[dict[str, Any]]:
        """Per pool: its size, the nodes watchd took out within the breaker's window, and the limit."""
        out = []
        for pool, size in sorted(self.executor.pools.sizes.items()) or [("all", 0)]:
            taken = self.store.breaker.since(pool, now - self.breaker_window_s, limit=TAKEN_OUT_LIMIT)
            out.append(
                {
                    "pool": pool,
                    "size": size,
                    "taken_out": [n for n, _ in taken],
                    "taken_out_count": self.store.breaker.count(pool, now - self.breaker_window_s),
                    "limit": self.executor.limits.allowed_in(size),
                }
            )
        return out

    def held(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Held actions, oldest first; with ``limit``, only the newest ``limit`` of them."""
        return [dataclasses.asdict(h) for h in self.store.held.list(limit=limit)]

    def recent_actions(self, limit: int) -> list[dict[str, Any]]:
        return [a.to_dict() for a in self.store.audit.recent(limit)]
