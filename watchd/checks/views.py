"""What the checks service shows: the checks with their schedules and rounds, a node's runs, the status
document's ``checks`` section (read from the state database and the service's book-keeping)."""

from __future__ import annotations

from typing import Any

from watchd.checks.params import ChecksConfig
from watchd.checks.partner_waits import PartnerWaits
from watchd.clock import Clock
from watchd.periodic import Periodic
from watchd.store.database import Store

__all__ = ["CheckViews"]


class CheckViews:
    """The reading half of :class:`~watchd.checks.service.CheckService`, which keeps these attributes."""

    config: ChecksConfig
    store: Store
    clock: Clock
    periodic: Periodic | None
    _running: dict[str, str]  # node -> run id
    _rounds: dict[str, str]  # check -> its round in progress
    _validating: set[str]
    _failing: dict[str, set[str]]  # node -> checks whose last result failed
    partner_waits: PartnerWaits  # validations waiting for a pair-check partner

    def listing(self) -> list[dict[str, Any]]:
        out = []
        next_runs = self.periodic.next_runs() if self.periodic is not None else {}
        for spec in self.config.items:
            last = self.store.checks.last_round(spec.name)
            nxt = next_runs.get(f"check:{spec.name}")
            out.append(
                {
                    "name": spec.name,
                    "type": spec.type,
                    "command": spec.argv(),
                    "schedule": spec.schedule.model_dump() if spec.schedule is not None else None,
                    "partitions": spec.partitions,
                    "nodes": spec.nodes,
                    "max_share": spec.max_share,
                    "time_limit_s": spec.time_limit,
                    "in_suite": spec.in_suite,
                    "last_round": None if last is None else {"round": last[0], "finished_at": last[2]},
                    "round_running": self._rounds.get(spec.name),
                    "next_run": nxt.timestamp() if nxt is not None else None,
                }
            )
        return out

    def history(self, node: str, limit: int = 20) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.store.checks.history(node, limit)]

    def status(self) -> dict[str, Any]:
        nodes = self.store.checks.all_nodes()
        failing = sorted(self._failing)
        return {
            "checks": self.listing(),
            "running": dict(sorted(self._running.items())),
            "validating": sorted(self._validating),
            "awaiting_validation": failing,
            # not checked: no partner for a pair check yet; validated again when one frees up
            "waiting_for_partner": {
                n: {"check": w.check, "since": w.since, "paged": w.paged}
                for n, w in sorted(self.partner_waits.nodes.items())
            },
            "backing_off": sorted({f"{n.check}:{n.node}" for n in nodes if n.next_try > self.clock.now()}),
            "last": [
                {
                    "check": n.check,
                    "node": n.node,
                    "outcome": n.last_outcome,
                    "last_run": n.last_run,
                    "last_success": n.last_success,
                }
                for n in sorted(nodes, key=lambda n: (n.check, n.node))[:500]
            ],
        }
