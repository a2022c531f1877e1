"""Who is at fault when two nodes run all_reduce slowly together (pure).

A 2-node nccl-tests run measures two nodes' NICs, cables and switch ports at once: a slow pair is not a
verdict on either node. A round therefore goes in passes, as Google's cluster-health-scanner does:

1. **pairing**: the idle nodes in pairs, nodes under the same switch together first (their links to the leaf
   switch are what a pair tests; with no topology known, in name order); an odd node waits for the second
   pass;
2. **second pass**: each node of a slow or failed pair (and the odd one) runs again with a node that just
   passed, a different partner each time it is tried, at most ``max_tries`` runs a node;
3. **attribution**: a node that ran badly with every partner, two at least, one of which ran well with
   someone else, is **at fault** (failed: drained by the default rules). A node that ran well with anyone
   passes. A pair that ran badly only together, each of its nodes fine with others, is a **link** (the cable,
   the ports or the switch path between them): it pages, nobody is drained. A node that could not be paired
   again is **unresolved**: no verdict, tried again in the next round.

So a round over ``n`` idle nodes with one bad node takes ``n/2`` runs, then 2 more (the bad node and its
first partner each with a good node): two waves of runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Attribution", "PairRun", "attribute", "first_pairs", "second_pairs"]


@dataclass(frozen=True, slots=True)
class PairRun:
    """One 2-node run and how it went: ``good`` (passed), else slow or failed with ``evidence``."""

    nodes: tuple[str, str]
    good: bool
    busbw_gbps: float | None = None
    evidence: str = ""
    judged: bool = True  # False: the run could not be judged (not started, timed out, unreadable)

    def partner(self, node: str) -> str:
        a, b = self.nodes
        return b if node == a else a


@dataclass
class Attribution:
    at_fault: dict[str, list[PairRun]] = field(default_factory=dict)  # node -> its bad runs
    passed: dict[str, PairRun] = field(default_factory=dict)  # node -> a good run of it
    links: list[PairRun] = field(default_factory=list)  # bad runs whose two nodes are good with others
    unresolved: dict[str, list[PairRun]] = field(default_factory=dict)  # node -> its bad runs so far


def first_pairs(nodes: Sequence[str], switch_of: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """The first pass: ``nodes`` in pairs, those of one switch together first, then the rest across
    switches, in name order; an odd node is left out (the second pass pairs it with a good node)."""
    switch_of = switch_of or {}
    by_switch: dict[str, list[str]] = {}
    for node in sorted(nodes):
        by_switch.setdefault(switch_of.get(node, ""), []).append(node)
    pairs: list[tuple[str, str]] = []
    rest: list[str] = []
    for switch in sorted(by_switch):
        members = by_switch[switch]
        pairs.extend((members[i], members[i + 1]) for i in range(0, len(members) - 1, 2))
        if len(members) % 2:
            rest.append(members[-1])
    pairs.extend((rest[i], rest[i + 1]) for i in range(0, len(rest) - 1, 2))
    return pairs


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
        partners = {r.partner(node) for r in rs}
        if len(partners) >= 2 and partners & good:
            out.at_fault[node] = rs
        else:
            out.unresolved[node] = rs
    out.links = [r for r in runs if r.judged and not r.good and all(n in good for n in r.nodes)]
    return out


def second_pairs(
    runs: Sequence[PairRun],
    pending: Iterable[str],
    *,
    max_tries: int = 3,
) -> list[tuple[str, str]]:
    """The next wave: each node still unresolved (or never run: ``pending``) with a node that passed and
    that it has not run with, each good node in one run at most, each node at most ``max_tries`` runs."""
    att = attribute(runs)
    by_node = _runs_of(runs)
    waiting = sorted(set(att.unresolved) | {n for n in pending if n not in by_node})
    free = sorted(att.passed)
    busy: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for node in waiting:
        tried = {r.partner(node) for r in by_node.get(node, [])}
        if len(by_node.get(node, [])) >= max_tries:
            continue
        partner = next((g for g in free if g not in busy and g not in tried and g != node), None)
        if partner is None:
            continue
        busy.add(partner)
        pairs.append((node, partner))
    return pairs
