"""Who is at fault when nodes run all_reduce slowly together (pure).

A multi-node nccl-tests run measures the nodes' NICs, cables and switch ports at once: a slow run is not a
verdict on any one node. A round therefore goes in waves, as Google's cluster-health-scanner does:

1. **grouping**: the idle nodes in groups of ``size`` (2: pairs), nodes under the same switch together first
   (with no topology known, in name order); a node left alone waits for a later wave;
2. **bisection** (groups larger than two): a slow group's two halves run on their own, so that a bad node is
   cornered in O(log n) waves; a half of one node waits for a good partner;
3. **second pass**: each node of a slow pair (and a node left alone) runs again with a node that just passed,
   a different partner each time, at most ``max_tries`` runs a node;
4. **attribution**: a node that ran badly in every run it was in, in two runs at least, one of them with only
   good nodes beside it, is **at fault** (failed: drained by the default rules). A node that ran well in any
   run passes. A slow run whose nodes all ran well elsewhere is a **link** (the cables, the ports or the
   switch path between them): it pages, nobody is drained. A node that could not run again is
   **unresolved**: no verdict, tried again in the next round.

So a round of pairs over ``n`` idle nodes with one bad node takes ``n/2`` runs, then 2 more (the bad node and
its first partner, each with a good node): two waves. With groups of ``k`` the bad group's halves take two
runs a level: ``n/k + 2 log2(k/2) + 2`` runs in ``log2(k) + 1`` waves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Attribution", "PairRun", "attribute", "first_groups", "first_pairs", "next_wave", "second_pairs"]

Group = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PairRun:
    """One multi-node run (a pair, or a group) and how it went: ``good`` (passed), else slow or failed."""

    nodes: Group
    good: bool
    busbw_gbps: float | None = None
    evidence: str = ""
    judged: bool = True  # False: the run could not be judged (not started, timed out, unreadable)

    def others(self, node: str) -> Group:
        return tuple(n for n in self.nodes if n != node)

    def partner(self, node: str) -> str:
        """The other node of a pair; the others of a group, comma-separated."""
        return ",".join(self.others(node))


@dataclass
class Attribution:
    at_fault: dict[str, list[PairRun]] = field(default_factory=dict)  # node -> its bad runs
    passed: dict[str, PairRun] = field(default_factory=dict)  # node -> a good run of it
    links: list[PairRun] = field(default_factory=list)  # bad runs whose nodes all ran well elsewhere
    unresolved: dict[str, list[PairRun]] = field(default_factory=dict)  # node -> its bad runs so far


def first_groups(
    nodes: Sequence[str], size: int = 2, switch_of: Mapping[str, str] | None = None
) -> list[Group]:
    """The first wave: ``nodes`` in groups of ``size``, those of one switch together first, then the rest
    across switches, in name order; a last group of fewer nodes runs as it is, a node alone is left out."""
    switch_of = switch_of or {}
    by_switch: dict[str, list[str]] = {}
    for node in sorted(nodes):
        by_switch.setdefault(switch_of.get(node, ""), []).append(node)
    groups: list[Group] = []
    rest: list[str] = []
    for switch in sorted(by_switch):
        members = by_switch[switch]
        whole = len(members) - len(members) % size
        groups.extend(tuple(members[i : i + size]) for i in range(0, whole, size))
        rest.extend(members[whole:])
    groups.extend(tuple(rest[i : i + size]) for i in range(0, len(rest), size) if len(rest[i : i + size]) > 1)
    return groups


def first_pairs(nodes: Sequence[str], switch_of: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """:func:`first_groups` of two."""
    return [(g[0], g[1]) for g in first_groups(nodes, 2, switch_of)]


def _runs_of(runs: Iterable[PairRun]) -> dict[str, list[PairRun]]:
    out: dict[str, list[PairRun]] = {}
    for run in runs:
        if run.judged:
            for node in run.nodes:
                out.setdefault(node, []).append(run)
    return out


def attribute(runs: Sequence[PairRun]) -> Attribution:
    """Each node's standing after ``runs`` (see the module)."""
    out = Attribution()
    by_node = _runs_of(runs)
    good = {n for n, rs in by_node.items() if any(r.good for r in rs)}
    for node, rs in sorted(by_node.items()):
        if node in good:
            out.passed[node] = next(r for r in rs if r.good)
            continue
        cornered = any(set(r.others(node)) <= good for r in rs)
        if len({r.nodes for r in rs}) >= 2 and cornered:
            out.at_fault[node] = rs
        else:
            out.unresolved[node] = rs
    out.links = [r for r in runs if r.judged and not r.good and all(n in good for n in r.nodes)]
    return out


def _halves(group: Group) -> tuple[Group, Group]:
    mid = len(group) // 2
    return group[:mid], group[mid:]


def next_wave(runs: Sequence[PairRun], pending: Iterable[str], *, max_tries: int = 3) -> list[Group]:
    """The next wave: the halves of each slow group of more than two not split yet; then each node still
    unresolved outside such a group (or never run: ``pending``) with a node that passed and that it has not
    run with, each good node in one run at most, each node in at most ``max_tries`` pairs."""
    att = attribute(runs)
    ran = {r.nodes for r in runs}
    wave: list[Group] = []
    splitting: set[str] = set()
    for run in runs:
        if not run.judged or run.good or len(run.nodes) <= 2 or set(run.nodes) <= set(att.passed):
            continue
        for half in _halves(run.nodes):
            if half in ran:
                continue
            if len(half) > 1:
                wave.append(half)
                splitting.update(half)
    by_node = _runs_of(runs)
    waiting = sorted((set(att.unresolved) | {n for n in pending if n not in by_node}) - splitting)
    free = sorted(att.passed)
    busy: set[str] = set()
    for node in waiting:
        runs_of = by_node.get(node, [])
        if sum(len(r.nodes) == 2 for r in runs_of) >= max_tries:
            continue  # tried in pairs enough
        tried = {n for r in runs_of if len(r.nodes) == 2 for n in r.others(node)}  # pairs: a group is no pair
        partner = next((g for g in free if g not in busy and g not in tried and g != node), None)
        if partner is None:
            continue
        busy.add(partner)
        wave.append((node, partner))
    return wave


def second_pairs(
    runs: Sequence[PairRun], pending: Iterable[str], *, max_tries: int = 3
) -> list[tuple[str, str]]:
    """:func:`next_wave` of a round of pairs."""
    return [(g[0], g[1]) for g in next_wave(runs, pending, max_tries=max_tries)]
