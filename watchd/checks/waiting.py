"""Validations waiting for a pair-check partner (pure): a node whose links could not be checked (no idle node
that passed the pair check) stays drained, ``not checked``; it is validated again as soon as a known-good
node is idle (read from the fleet listing the engine already keeps, no call of its own), and paged about once
after ``checks.partner_wait`` (10 minutes by default)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from watchd.model.fleet import FleetNode
from watchd.store.checks import CheckNode

__all__ = ["Waiting", "free_partners", "page_due"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """A node whose validation could not check its links with ``check``, since ``since`` (epoch s)."""

    check: str
    since: float
    evidence: str
    round: str
    run_id: str
    paged: bool = False


def page_due(waiting: Mapping[str, Waiting], now: float, wait_s: float) -> list[str]:
    """The nodes waiting ``wait_s`` or longer, not paged about yet."""
    return sorted(n for n, w in waiting.items() if not w.paged and now - w.since >= wait_s)


def _idle(n: FleetNode) -> bool:
    return n.idle and not n.spare and "RESERVED" not in n.flags


def free_partners(
    waiting: Mapping[str, Waiting],
    listing: Sequence[FleetNode],
    state: Mapping[str, Mapping[str, CheckNode]],
    partitions: Mapping[str, Iterable[str]],
    busy: Iterable[str] = (),
) -> dict[str, str]:
    """For each waiting node a partner it may run with now, as the fleet listing shows the nodes: idle, in a
    partition the node is in (and among the check's ``partitions`` when it names any), its last run of the
    check passed (``state``: check -> node -> where it stands). Nodes with none are absent."""
    by_name = {n.name: n for n in listing}
    taken = set(busy) | set(waiting)
    out: dict[str, str] = {}
    for node, w in sorted(waiting.items()):
        me = by_name.get(node)
        if me is None:
            continue
        allowed = set(partitions.get(w.check, ()))
        mine = {p for p in me.partitions if not allowed or p in allowed}
        good = state.get(w.check, {})
        for n in listing:
            st = good.get(n.name)
            if (
                n.name not in taken
                and st is not None
                and st.last_outcome == "passed"
                and _idle(n)
                and mine & set(n.partitions)
            ):
                out[node] = n.name
                break
    return out
