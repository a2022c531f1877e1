"""The risk planner's model (pure: evidence in as data, scores and an order out, ``now`` passed in).

A node's score is the expected number of latent faults it carries now, a proportional-hazards estimate:

    score = base_rate_per_node_day x days since its last pass x the product of its factors' ratios

and the probability that it carries at least one is ``1 - exp(-score)``. The factors (each an explained
term; :mod:`watchd.checks.risk_params` says where every default comes from): the lemon term (its hardware
failures in the lemon window, as the reliability record counts them), hardware events and NIC errors since
its last pass (within the event window), a peer under the same leaf switch whose last result of the check
failed, a return to service after a repair. A node never passed counts ``max_interval`` of exposure.

The order: nodes due by the floor (not passed for ``max_interval``) first, the longest waiting first; then
by score, highest first; then by name. The budget (:class:`Order`) admits nodes in that order while their
partitions have GPU-hours left; a due node is admitted whatever is left (the floor wins, and says so)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from watchd.checks.risk_params import RiskBudget, RiskWeights

__all__ = ["DAY", "NodeEvidence", "Order", "Risk", "Term", "budget_left", "lemon_posterior", "order", "score"]

DAY = 86400.0


@dataclass(frozen=True, slots=True)
class NodeEvidence:
    """What is known of one node, read by the caller from the state database and the event stream."""

    last_pass: float | None = None  # the check's last pass on the node
    hardware: Sequence[float] = ()  # times of hardware-evidence events (Xids of hardware buckets, ...)
    nic: Sequence[float] = ()  # times of NIC / InfiniBand error events
    failures: Sequence[float] = ()  # times of hardware failures (watchd drains on hardware evidence)
    repaired_at: float | None = None  # when it last returned to service after such a failure
    peers_failed: Sequence[str] = ()  # nodes under the same leaf switch whose last result failed


@dataclass(frozen=True, slots=True)
class Term:
    name: str  # exposure | lemon | hardware | nic | switch | repair
    ratio: float  # the factor it multiplies the score by (exposure: days)
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ratio": round(self.ratio, 3), "why": self.why}


@dataclass(frozen=True, slots=True)
class Risk:
    node: str
    score: float
    exposure_days: float
    due: bool  # past the floor: checked whatever the budget
    terms: tuple[Term, ...]

    @property
    def probability(self) -> float:
        return 1.0 - math.exp(-self.score)

    def factors(self) -> list[Term]:
        """The terms that raise the score, the strongest first (exposure is always there)."""
        return sorted((t for t in self.terms if t.name != "exposure"), key=lambda t: -t.ratio)

    def why(self) -> str:
        parts = [t.why for t in self.terms if t.name == "exposure"]
        parts += [f"{t.why} x{t.ratio:.1f}" for t in self.factors()]
        return "; ".join(parts)


def lemon_posterior(failures: int, w: RiskWeights) -> tuple[float, float]:
    """(P(the node is a lemon | its failures in the window), the expected rate ratio against a normal
    node): a two-rate mixture, ``lemon_share`` of nodes failing ``lemon_rate_ratio`` times as often, whose
    fleet average is ``base_rate_per_node_day``; the counts in the window are Poisson."""
    share, ratio = w.lemon_share, w.lemon_rate_ratio
    normal_rate = w.base_rate_per_node_day / ((1 - share) + share * ratio)
    days = w.lemon_window / DAY
    mu_n, mu_l = normal_rate * days, normal_rate * ratio * days
    # Poisson likelihoods, in logs (k! cancels)
    log_n = failures * math.log(mu_n) - mu_n
    log_l = failures * math.log(mu_l) - mu_l
    odds = math.exp(math.log(share) + log_l - math.log(1 - share) - log_n)
    p = odds / (1 + odds)
    return p, p * ratio + (1 - p)


def _since(times: Iterable[float], start: float) -> list[float]:
    return sorted(t for t in times if t >= start)


def score(node: str, ev: NodeEvidence, now: float, w: RiskWeights, max_interval: float | None = None) -> Risk:
    """One node's score and its explanation."""
    floor_s = max_interval if max_interval is not None else 14 * DAY
    exposure = floor_s if ev.last_pass is None else max(0.0, now - ev.last_pass)
    days = exposure / DAY
    ago = f"{days:.1f} days" if days >= 1 else f"{exposure / 3600:.1f} h"
    since_pass = "never passed" if ev.last_pass is None else f"{ago} since its last pass"
    terms = [Term("exposure", days, since_pass)]
    ratio = 1.0
    lemon_failures = len(_since(ev.failures, now - w.lemon_window))
    if lemon_failures:
        p, r = lemon_posterior(lemon_failures, w)
        window = w.lemon_window / DAY
        terms.append(Term("lemon", r, f"lemon {p:.0%}: {lemon_failures} failures in {window:g} days"))
        ratio *= r
    start = max(now - w.event_window, ev.last_pass if ev.last_pass is not None else -math.inf)
    for name, times, label, r in (
        ("hardware", ev.hardware, "hardware events", w.hardware_event_ratio),
        ("nic", ev.nic, "NIC errors", w.nic_event_ratio),
    ):
        recent = _since(times, start)
        if recent:
            hours = (now - recent[-1]) / 3600.0
            terms.append(Term(name, r, f"{len(recent)} {label} since its last pass (last {hours:.0f} h ago)"))
            ratio *= r
    if ev.peers_failed:
        peers = ", ".join(sorted(ev.peers_failed)[:3]) + ("..." if len(ev.peers_failed) > 3 else "")
        terms.append(Term("switch", w.switch_peer_ratio, f"peers on its switch failed ({peers})"))
        ratio *= w.switch_peer_ratio
    if ev.repaired_at is not None and now - ev.repaired_at <= w.repair_window:
        hours = (now - ev.repaired_at) / 3600.0
        passed_since = ev.last_pass is not None and ev.last_pass >= ev.repaired_at
        if not passed_since:
            terms.append(Term("repair", w.repair_ratio, f"back from repair {hours:.0f} h ago"))
            ratio *= w.repair_ratio
    value = w.base_rate_per_node_day * days * ratio
    due = max_interval is not None and exposure >= max_interval
    return Risk(node, value, days, due, tuple(terms))


def order(risks: Iterable[Risk]) -> list[Risk]:
    """Due nodes first (the longest waiting first), then the highest score first, then by name."""
    return sorted(risks, key=lambda r: (not r.due, -r.exposure_days if r.due else -r.score, r.node))


@dataclass
class Order:
    """A round's order and budget, handed to :func:`watchd.checks.plan.pick`: ``rank`` orders the nodes;
    :meth:`admit` says whether a node fits in what its partitions have left (and spends it) or why not."""

    ranked: list[Risk]
    cost: Mapping[str, float]  # node -> GPU-hours one run costs
    remaining: dict[str, float] | None = None  # partition -> GPU-hours left; None: no budget
    admitted_over: set[str] = field(default_factory=set)  # due nodes admitted past the budget

    def __post_init__(self) -> None:
        self.rank = {r.node: i for i, r in enumerate(self.ranked)}
        self.by_node = {r.node: r for r in self.ranked}

    def admit(self, node: str, partitions: Sequence[str]) -> str | None:
        if self.remaining is None:
            return None
        cost = self.cost.get(node, 0.0)
        risk = self.by_node.get(node)
        fits = all(self.remaining.get(p, 0.0) >= cost - 1e-9 for p in partitions)
        if not fits and not (risk is not None and risk.due):
            left = min((self.remaining.get(p, 0.0) for p in partitions), default=0.0)
            return f"beyond the budget ({cost:.2f} GPU-hours, {left:.2f} left)"
        if not fits:
            self.admitted_over.add(node)
        for p in partitions:
            self.remaining[p] = self.remaining.get(p, 0.0) - cost
        return None


def budget_left(
    budget: RiskBudget | None, spent: Mapping[str, float], partitions: Iterable[str]
) -> dict[str, float] | None:
    """GPU-hours each partition has left in the period, ``spent`` already."""
    if budget is None:
        return None
    return {p: budget.gpu_hours - spent.get(p, 0.0) for p in partitions}
