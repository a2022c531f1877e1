"""The engine's status read model: what ``GET /api/v1/status`` (and ``watchd status``) shows, assembled from
the fleet state (nodes, jobs), the store (audit, held actions, breaker counts), the executor (mode, pools,
limits) and the alert sink. It only reads."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from watchd.actions.executor import ActionExecutor
from watchd.clock import Clock
from watchd.detect.correlator import Correlator
from watchd.detect.finding import Finding
from watchd.integrations.alertmanager.notifier import AlertmanagerNotifier
from watchd.store.database import Store

_INCIDENT_ACTIONS = ("drain", "requeue", "alert")  # what makes a node an incident in the status


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

    def document(self) -> dict[str, Any]:
        now = self.clock.now()
        recent = self.recent_actions(200)
        incidents: dict[str, dict[str, Any]] = {}
        for a in recent:
            if a["action"] in _INCIDENT_ACTIONS and a["outcome"] != "deduplicated":
                node = incidents.setdefault(a["node"], {"node": a["node"], "actions": []})
                node["actions"].append({k: a[k] for k in ("time", "rule", "action", "outcome", "detail")})
        held = self.held()
        nodes = self.correlator.fleet.nodes(now)
        for node in nodes:
            incident = incidents.get(node["node"])
            node["last_action"] = incident["actions"][-1] if incident else None
            node["held"] = sum(1 for h in held if h["node"] == node["node"])
        return {
            "mode": self.executor.mode,
            "pid": os.getpid(),
            "nodes": nodes,
            "rules": self.rule_names(),
            "queue_depth": self.queue.qsize(),
            "scheduler": self.scheduler,
            "incidents": list(incidents.values()),
            "recent_actions": recent[-50:],
            "held": held,
            "jobs": self.correlator.last_cycle_jobs,
            "findings": [f.to_event().to_wire() for f in list(self.findings)[-50:]],
            "breaker": self.breaker(now),
            "alerts": self.alerts.state() if self.alerts is not None else [],
        }

    def breaker(self, now: float) -> list[dict[str, Any]]:
        """Per pool: its size, the nodes watchd took out within the breaker's window, and the limit."""
        out = []
        for pool, size in sorted(self.executor.pools.sizes.items()) or [("all", 0)]:
            taken = self.store.breaker.since(pool, now - self.breaker_window_s)
            out.append(
                {
                    "pool": pool,
                    "size": size,
                    "taken_out": [n for n, _ in taken],
                    "limit": self.executor.limits.allowed_in(size),
                }
            )
        return out

    def held(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(h) for h in self.store.held.list()]

    def recent_actions(self, limit: int) -> list[dict[str, Any]]:
        return [a.to_dict() for a in self.store.audit.recent(limit)]
