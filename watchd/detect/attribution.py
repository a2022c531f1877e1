"""Which of a job's nodes a training-log line is about. Pure.

A node's own log (a pod's log, a unit's journal, a Flight Recorder dump in the node's ``/tmp``) speaks for the
node whose agent read it. A Slurm batch job's output file does not: it gathers what every task printed, on
every node of the job, and the agent on the job's batch host is the one that reads it (``gathered`` lines).
Such a line is credited to

1. the host it names, NCCL's ``host:pid:tid`` prefix, when that host is one of the job's nodes (the same name,
   or the same first DNS label: NCCL prints ``gethostname()``, which may be qualified where Slurm's node name
   is short); a line naming a host outside the job is nobody's;
2. else the node its rank is known to run on (:data:`Placement`: the rank's heartbeats, its Flight Recorder
   dump, a gathered line that named both its rank and its host);
3. else the job's node, when the job has one;
4. else nobody: in a multi-node job the reader's node is not evidence of who printed the line.

A gathered line is credited only when its reader is one of the job's nodes (the batch host is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Origin", "Placement", "credit", "host_node"]

#: where a job's rank runs (``rank -> node``, or the host it printed), None where unknown
Placement = Callable[[int], str | None]


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a line came from: the agent that shipped it, whether it was read from a job's gathered output,
    and the host and rank the line itself names."""

    reporter: str
    gathered: bool = False
    host: str | None = None
    rank: int | None = None


def _short(name: str) -> str:
    return name.lower().split(".", 1)[0]


def host_node(host: str, nodes: Sequence[str]) -> str | None:
    """The node of ``nodes`` that ``host`` names: the same name (case aside), else the only node with the same
    first label."""
    wanted = host.lower()
    for node in nodes:
        if node.lower() == wanted:
            return node
    same = [node for node in nodes if _short(node) == _short(host)]
    return same[0] if len(same) == 1 else None


def credit(origin: Origin, nodes: Sequence[str], placed: Placement) -> str | None:
    """The node of a job on ``nodes`` that a line from ``origin`` is about, or None (see the module)."""
    if not origin.gathered:
        return origin.reporter
    if origin.reporter not in nodes:
        return None
    if origin.host is not None:
        return host_node(origin.host, nodes)
    if origin.rank is not None:
        where = placed(origin.rank)
        node = host_node(where, nodes) if where is not None else None
        if node is not None:
            return node
    return nodes[0] if len(nodes) == 1 else None
