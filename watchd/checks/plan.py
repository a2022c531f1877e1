"""Planning a round (pure): which nodes a check covers, how many of a partition may be checked at once, and
which nodes to start now, in what order. No I/O: the runner's answers and the state database's rows come in,
a plan goes out (benchmarks/checks_plan.py times it over a 200-node partition)."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from watchd.checks.params import CheckSpec
from watchd.checks.risk import Order
from watchd.checks.runner import Availability
from watchd.store.checks import CheckNode

__all__ = ["Pick", "candidates", "caps", "pick", "round_id"]


def round_id(check: str, scheduled_at: float) -> str:
    """A round's identity: the check and the time its schedule fired (so a restart resumes, never repeats)."""
    return f"{check}@{datetime.fromtimestamp(scheduled_at, UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def candidates(spec: CheckSpec, members: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """The nodes ``spec`` covers and the partitions each belongs to (among those it covers): the members of
    its partitions (every partition when it names none), kept only if they match its node patterns (when it
    has any)."""
    wanted = spec.partitions or list(members)
    out: dict[str, list[str]] = {}
    for partition in wanted:
        for node in members.get(partition, ()):
            if spec.nodes and not any(fnmatch.fnmatchcase(node, p) for p in spec.nodes):
                continue
            out.setdefault(node, []).append(partition)
    return {n: tuple(ps) for n, ps in out.items()}


def caps(spec: CheckSpec, members: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """At most this many nodes of each partition are checked at once: ``max_share`` of its size (>= 1)."""
    return {p: max(1, math.floor(spec.max_share * len(nodes) + 1e-9)) for p, nodes in members.items()}


@dataclass
class Pick:
    start: list[tuple[str, str]] = field(default_factory=list)  # (node, partition to submit in)
    waiting: dict[str, str] = field(default_factory=dict)  # not now, maybe later in the round: node -> why
    passed_over: dict[str, str] = field(default_factory=dict)  # not in this round: node -> why


def pick(
    cands: Mapping[str, tuple[str, ...]],
    availability: Mapping[str, Availability],
    state: Mapping[str, CheckNode],
    *,
    running: Mapping[str, tuple[str, ...]],
    done: Collection[str],
    limits: Mapping[str, int],
    now: float,
    order: Order | None = None,
) -> Pick:
    """The nodes to start now. Never a node that is running a check, done in this round, backing off, or not
    idle; never more than ``limits`` per partition counting those running; the least recently checked
    first (never checked: first of all). With ``order`` (the risk planner's): in its order, and only the
    nodes its budget admits (the others are passed over for this round, with why)."""
    out = Pick()
    load: dict[str, int] = {}
    for parts in running.values():
        for p in parts:
            load[p] = load.get(p, 0) + 1

    def last(node: str) -> float:
        st = state.get(node)
        return -1.0 if st is None or st.last_run is None else st.last_run

    if order is None:
        ranked = sorted(cands, key=lambda n: (last(n), n))
    else:
        ranked = sorted(cands, key=lambda n: (order.rank.get(n, len(order.rank)), n))
    for node in ranked:
        if node in done or node in running:
            continue
        st = state.get(node)
        if st is not None and st.next_try > now:
            out.passed_over[node] = (
                f"backing off after {st.failures} failures to run (until {st.next_try:.0f})"
            )
            continue
        avail = availability.get(node)
        if avail is None:
            out.passed_over[node] = "unknown to the scheduler"
            continue
        if not avail.idle:
            out.waiting[node] = avail.why or "not idle"
            continue
        parts = cands[node]
        if any(load.get(p, 0) >= limits.get(p, 1) for p in parts):
            out.waiting[node] = "share of the partition already being checked"
            continue
        refused = order.admit(node, parts) if order is not None else None
        if refused is not None:
            out.passed_over[node] = refused
            continue
        for p in parts:
            load[p] = load.get(p, 0) + 1
        out.start.append((node, parts[0]))
    return out
