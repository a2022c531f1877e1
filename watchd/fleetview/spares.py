"""Hot spares: a configured number of idle nodes per partition kept out of normal scheduling, released at
once when watchd drains a node that was running jobs, so that the requeued job finds a node.

The decisions, in plain code:

* :func:`plan_replenish`: which idle nodes to add to a partition's spares, never beyond the number
  configured, never a node with a job, a flag or a reason (and a node is a spare of one partition only).
  Nodes watchd itself returned to service (``preferred``: resumed after validation) come first, then the
  others in name order, so that the choice is stable.
* :func:`plan_trim`: the spares beyond the number configured (the configuration was lowered) and the
  spares that are no longer fit (drained, down, or running a job someone placed there by reservation):
  they are released, never kept.
* :func:`pick_release`: which spare to hand back when a drained node's jobs were requeued. Until those jobs
  run again (or ``spares.keep_for_requeued_s`` passes), their partition is not topped up (``paused``): a
  requeued job may not start before Slurm's ``cred_expire`` (120 s by default), and a top-up in between
  would take back the spare released for it, or a node it left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from watchd.model.fleet import FleetNode

__all__ = ["SparePlan", "pick_release", "plan", "plan_replenish", "plan_trim"]


@dataclass(frozen=True, slots=True)
class SparePlan:
    """partition -> nodes to add to its spares, and partition -> nodes to give back to normal scheduling."""

    add: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    remove: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not any(self.add.values()) and not any(self.remove.values())


def _members(nodes: Iterable[FleetNode]) -> dict[str, dict[str, FleetNode]]:
    out: dict[str, dict[str, FleetNode]] = {}
    for n in nodes:
        for p in n.partitions:
            out.setdefault(p, {})[n.name] = n
    return out


def plan_trim(
    want: Mapping[str, int], spares: Mapping[str, Sequence[str]], nodes: Iterable[FleetNode]
) -> dict[str, tuple[str, ...]]:
    """The spares to give back: those no longer fit (out of service, busy, gone from the partition), then
    the newest beyond the configured count (``spares`` lists each partition's in the order they were
    taken)."""
    members = _members(nodes)
    out: dict[str, tuple[str, ...]] = {}
    for partition, held in spares.items():
        part = members.get(partition, {})
        unfit = [s for s in held if s not in part or not _fit(part[s])]
        fit = [s for s in held if s not in unfit]
        excess = fit[want.get(partition, 0) :]
        if unfit or excess:
            out[partition] = tuple(unfit + excess)
    return out


def _fit(n: FleetNode) -> bool:
    """A node that may stay (or become) a spare: idle, in service, nothing else on it."""
    return n.idle


def plan_replenish(
    want: Mapping[str, int],
    spares: Mapping[str, Sequence[str]],
    nodes: Iterable[FleetNode],
    preferred: Iterable[str] = (),
    paused: Iterable[str] = (),
) -> dict[str, tuple[str, ...]]:
    """The idle nodes to add to each partition's spares so that it holds ``want[partition]``; fewer when
    not enough nodes are idle. ``spares`` are the current ones (fit or not: a partition never holds more
    than ``want`` counting them all). Nothing is added to a ``paused`` partition: jobs watchd requeued
    there wait to start again, and every idle node (the spare released for them, the nodes they left)
    may be the one they need."""
    nodes = list(nodes)
    members = _members(nodes)
    taken = {s for held in spares.values() for s in held}
    first = set(preferred)
    skip = set(paused)
    out: dict[str, tuple[str, ...]] = {}
    for partition, count in sorted(want.items()):
        need = count - len(spares.get(partition, ()))
        if need <= 0 or partition in skip:
            continue
        candidates = [
            n.name
            for n in members.get(partition, {}).values()
            if n.name not in taken and not n.spare and _fit(n)
        ]
        candidates.sort(key=lambda name: (name not in first, name))
        chosen = tuple(candidates[:need])
        if chosen:
            out[partition] = chosen
            taken.update(chosen)
    return out


def plan(
    want: Mapping[str, int],
    spares: Mapping[str, Sequence[str]],
    nodes: Iterable[FleetNode],
    preferred: Iterable[str] = (),
    paused: Iterable[str] = (),
) -> SparePlan:
    """Trim first, then replenish up to the count with what remains (never a ``paused`` partition)."""
    nodes = list(nodes)
    remove = plan_trim(want, spares, nodes)
    kept = {p: [s for s in held if s not in remove.get(p, ())] for p, held in spares.items()}
    add = plan_replenish(want, kept, nodes, preferred, paused)
    return SparePlan(add=add, remove=remove)


def pick_release(spares: Sequence[str], count: int = 1) -> tuple[str, ...]:
    """The spares handed back first: the longest held (``spares`` in the order they were taken)."""
    return tuple(spares[: max(0, count)])
