"""The risk planner in the engine: reads what the pure model (:mod:`watchd.checks.risk`) needs from the state
database (the check's results and recent runs, the reliability record's failures and GPU counts), the
event stream (:class:`~watchd.checks.risk_evidence.EventEvidence`) and Slurm's topology.conf, and gives the
service a round's :class:`~watchd.checks.risk.Order` (:meth:`RiskPlanner.order`), and ``watchd checks
plan`` its document (:meth:`RiskPlanner.document`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from watchd.checks.params import ChecksConfig, CheckSpec
from watchd.checks.risk import DAY, NodeEvidence, Order, budget_left, order, score
from watchd.checks.risk_evidence import EventEvidence
from watchd.checks.runner import Availability
from watchd.checks.topology import read_leaf_switches
from watchd.clock import Clock
from watchd.logs import get_logger
from watchd.store.checks import CheckNode
from watchd.store.database import Store

__all__ = ["RiskPlanner"]

_log = get_logger("watchd.checks.risk")
_DURATION_RUNS = 50  # the recent runs whose median duration estimates a run's cost
_FAILED = ("failed", "timeout")


class RiskPlanner:
    def __init__(
        self,
        config: ChecksConfig,
        store: Store,
        clock: Clock,
        evidence: EventEvidence | None = None,
        switches: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.evidence = evidence or EventEvidence()
        if switches is None:
            switches = read_leaf_switches(config.risk.topology)
        self.switches: Mapping[str, str] = switches

    # ------------------------------------------------------------------------------------------ inputs
    def _evidence(
        self, spec: CheckSpec, nodes: Mapping[str, tuple[str, ...]], now: float
    ) -> dict[str, NodeEvidence]:
        w = self.config.risk
        state = self.store.checks.nodes(spec.name)
        failures: dict[str, list[float]] = {}
        repaired: dict[str, float] = {}
        for f in self.store.reliability.failures(now - w.lemon_window - w.repair_window):
            failures.setdefault(f.node, []).append(f.time)
            if f.back_at is not None:
                repaired[f.node] = max(repaired.get(f.node, f.back_at), f.back_at)
        failed_by_switch: dict[str, list[str]] = {}
        for node, row in state.items():
            switch = self.switches.get(node)
            recent = row.last_run is not None and row.last_run >= now - w.event_window
            if switch is not None and recent and row.last_outcome in _FAILED:
                failed_by_switch.setdefault(switch, []).append(node)
        out = {}
        for node in nodes:
            st = state.get(node)
            switch = self.switches.get(node)
            peers = [p for p in failed_by_switch.get(switch, ()) if p != node] if switch else []
            out[node] = NodeEvidence(
                last_pass=st.last_success if st is not None else None,
                hardware=self.evidence.of(node, "hardware"),
                nic=self.evidence.of(node, "nic"),
                failures=failures.get(node, ()),
                repaired_at=repaired.get(node),
                peers_failed=peers,
            )
        return out

    def _costs(
        self, spec: CheckSpec, nodes: Mapping[str, tuple[str, ...]], now: float
    ) -> tuple[dict[str, float], dict[str, float], float]:
        """(GPU-hours a run costs on each node, GPU-hours spent per partition in the budget's period, the
        estimated duration in seconds)."""
        budget = spec.budget
        per = budget.per if budget is not None else DAY
        runs = [r for r in self.store.checks.since(spec.name, now - max(per, 7 * DAY)) if not r.validation]
        durations = [d for r in runs if r.finished_at is not None and (d := r.finished_at - r.started_at) > 0]
        duration = statistics.median(durations[-_DURATION_RUNS:]) if durations else spec.time_limit
        default_gpus = budget.gpus_per_node if budget is not None else 8
        gpus = {row.node: row.gpus for row in self.store.reliability.nodes() if row.gpus > 0}
        cost = {n: duration * gpus.get(n, default_gpus) / 3600.0 for n in nodes}
        spent: dict[str, float] = {}
        for r in runs:
            if r.started_at < now - per:
                continue
            took = (r.finished_at if r.finished_at is not None else now) - r.started_at
            gpu_h = max(0.0, took) * gpus.get(r.node, default_gpus) / 3600.0
            for p in nodes.get(r.node, ()):
                spent[p] = spent.get(p, 0.0) + gpu_h
        return cost, spent, duration

    # -------------------------------------------------------------------------------------------- plans
    def order(self, spec: CheckSpec, nodes: Mapping[str, tuple[str, ...]]) -> Order | None:
        """The round's order and budget (None: the check's planner is ``oldest_first``)."""
        if spec.planner != "risk":
            return None
        return self._order(spec, nodes, self.clock.now())

    def _order(self, spec: CheckSpec, nodes: Mapping[str, tuple[str, ...]], now: float) -> Order:
        w = self.config.risk
        floor = spec.budget.max_interval if spec.budget is not None else None
        ev = self._evidence(spec, nodes, now)
        ranked = order(score(n, ev[n], now, w, floor) for n in nodes)
        cost, spent, _ = self._costs(spec, nodes, now)
        partitions = {p for ps in nodes.values() for p in ps}
        return Order(ranked, cost, budget_left(spec.budget, spent, partitions))

    def document(
        self,
        spec: CheckSpec,
        nodes: Mapping[str, tuple[str, ...]],
        availability: Mapping[str, Availability],
        state: Mapping[str, CheckNode],
    ) -> dict[str, Any]:
        """``watchd checks plan``: every node in the order a round would try them, its score and why, and
        whether the budget reaches it (admission played out on the nodes idle now)."""
        now = self.clock.now()
        plan = self._order(spec, nodes, now)
        _, spent, duration = self._costs(spec, nodes, now)
        if spec.planner != "risk":  # the order a round takes: the least recently checked first
            last = {
                n: (st.last_run if (st := state.get(n)) and st.last_run is not None else -1.0) for n in nodes
            }
            plan.ranked.sort(key=lambda r: (last[r.node], r.node))
        rows = []
        for i, r in enumerate(plan.ranked):
            parts = nodes.get(r.node, ())
            avail = availability.get(r.node)
            st = state.get(r.node)
            if st is not None and st.next_try > now:
                verdict = f"backing off until {st.next_try:.0f}"
            elif avail is None:
                verdict = "unknown to the scheduler"
            elif not avail.idle:
                verdict = f"not idle: {avail.why or 'busy'}"
            else:
                refused = plan.admit(r.node, parts) if spec.planner == "risk" else None
                if refused:
                    verdict = refused
                elif r.node in plan.admitted_over:
                    verdict = "due (floor): checked past the budget"
                else:
                    verdict = (
                        "due (floor)" if r.due else "in budget" if plan.remaining is not None else "next"
                    )
            rows.append(
                {
                    "rank": i + 1,
                    "node": r.node,
                    "partitions": list(parts),
                    "score": r.score,
                    "probability": round(r.probability, 4),
                    "exposure_days": round(r.exposure_days, 2),
                    "due": r.due,
                    "why": r.why(),
                    "factors": [t.to_dict() for t in r.factors()],
                    "cost_gpu_hours": round(plan.cost.get(r.node, 0.0), 3),
                    "plan": verdict,
                }
            )
        budget = spec.budget
        return {
            "check": spec.name,
            "planner": spec.planner,
            "now": now,
            "budget": None
            if budget is None
            else {
                "gpu_hours": budget.gpu_hours,
                "per_s": budget.per,
                "max_interval_s": budget.max_interval,
                "spent": {p: round(v, 3) for p, v in sorted(spent.items())},
            },
            "run_duration_s": duration,
            "nodes": rows,
        }
