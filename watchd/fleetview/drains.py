"""``sinfo -R`` for the whole fleet: which nodes are out of service, who took them out, and since when.

A scheduler integration lists every node as a :class:`FleetNode` (Slurm: ``sinfo -N``; Kubernetes: the
Node objects); this module decides, in plain code, which are unavailable and classifies each:

* **owner class** (:data:`OWNERS`), from the reason first and the user second:

  - ``watchd``: the reason carries watchd's prefix (``watchd: Xid 79 ...``), or on Kubernetes watchd's
    drain annotation is on the node;
  - ``nhc``: LBNL Node Health Check's ``NHC:`` prefix;
  - ``scheduler``: the workload manager itself: Slurm's own reasons (``Not responding``, ``Kill task
    failed``, ``Node unexpectedly rebooted``, ``Prolog error``, ``Low RealMemory`` ...; the full list is
    :data:`SLURM_OWN_REASONS`), Kubernetes' ``node.kubernetes.io/*`` taints (not-ready, unreachable ...);
  - ``admin``: anything else with a reason (a person ran ``scontrol update ... Reason=`` or ``kubectl
    cordon``);
  - ``other``: out of service with no reason at all (a node down before anyone said why).

* **reason class** (:data:`REASON_CLASSES`): a bounded label for metrics (the reason itself is free text).

* **age**: now minus the time the reason was set (``sinfo %H``; the taint's ``timeAdded``), and an age
  bucket (:data:`AGE_BUCKETS`) so that the metrics stay bounded whatever the fleet's size.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from watchd.model.fleet import KUBERNETES_OWN_TAINTS, SLURM_OWN_REASONS, FleetNode
from watchd.model.nodes import WATCHD_REASON_PREFIX

__all__ = [
    "AGE_BUCKETS",
    "OWNERS",
    "REASON_CLASSES",
    "SLURM_OWN_REASONS",
    "FleetNode",
    "Owner",
    "PartitionAvailability",
    "Unavailable",
    "age_bucket",
    "availability",
    "classify_owner",
    "classify_reason",
    "unavailable_nodes",
]

Owner = Literal["watchd", "nhc", "scheduler", "admin", "other"]
OWNERS: tuple[Owner, ...] = ("watchd", "nhc", "scheduler", "admin", "other")

NHC_PREFIX = "NHC:"


REASON_CLASSES: tuple[str, ...] = (
    # watchd's own, from the evidence its reasons start with
    "xid",
    "gpu_health",
    "hang",
    "straggler",
    "lemon",
    # the scheduler's own
    *sorted(set(SLURM_OWN_REASONS.values()) | set(KUBERNETES_OWN_TAINTS.values())),
    # the rest
    "nhc",
    "admin",
    "unknown",
)

#: (label, upper bound in seconds): how long a node has been out, for the metrics.
AGE_BUCKETS: tuple[tuple[str, float], ...] = (
    ("1h", 3600.0),
    ("6h", 6 * 3600.0),
    ("1d", 86400.0),
    ("7d", 7 * 86400.0),
    ("30d", 30 * 86400.0),
    ("older", float("inf")),
)

_WATCHD_CLASSES = (
    (
        re.compile(r"^\w+: hang\b", re.I),
        "hang",
    ),  # the pack's hang reasons start so, whatever evidence follows
    (re.compile(r"\bxid ?\d*\b", re.I), "xid"),  # "Xid79 3b:00 ..." (the pack's), "Xid 79 ..." (before)
    (re.compile(r"\b(hang|stall|stalled|nccl)\b", re.I), "hang"),
    (re.compile(r"\bstraggl", re.I), "straggler"),
    (re.compile(r"\blemon\b", re.I), "lemon"),
    (
        re.compile(
            r"\b(ecc|row.?remap|pcie|nvlink|thermal|power.?brake|slowdown|gpu ?\d* lost|fallen off"
            r"|reset needed)",
            re.I,
        ),
        "gpu_health",
    ),
)


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A node out of service, classified."""

    node: str
    scheduler: str
    partitions: tuple[str, ...]
    state: str
    owner: Owner
    reason_class: str
    reason: str
    user: str | None
    since: float | None
    age_s: float | None

    @property
    def age_bucket(self) -> str:
        return age_bucket(self.age_s)

    def to_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "scheduler": self.scheduler,
            "partitions": list(self.partitions),
            "state": self.state,
            "owner": self.owner,
            "reason_class": self.reason_class,
            "reason": self.reason,
            "user": self.user,
            "since": self.since,
            "age_s": None if self.age_s is None else round(self.age_s, 1),
        }


@dataclass(frozen=True, slots=True)
class PartitionAvailability:
    partition: str
    total: int
    unavailable: int
    spares: int = 0
    by_owner: Mapping[str, int] = field(default_factory=dict)

    @property
    def available(self) -> int:
        return self.total - self.unavailable

    @property
    def available_share(self) -> float:
        """The share of the partition in service (spares count as in service); 1.0 for an empty one."""
        return self.available / self.total if self.total else 1.0


def _slurm_own(reason: str) -> str | None:
    low = reason.lower()
    for prefix, cls in SLURM_OWN_REASONS.items():
        if low.startswith(prefix):
            return cls
    return None


def _kubernetes_own(taints: Sequence[str]) -> str | None:
    for key in taints:
        if key in KUBERNETES_OWN_TAINTS and key != "node.kubernetes.io/unschedulable":
            return KUBERNETES_OWN_TAINTS[key]
    return None


def classify_owner(node: FleetNode, prefix: str = WATCHD_REASON_PREFIX) -> Owner:
    """Who took ``node`` out of service (see the module's documentation for the order of the tests)."""
    reason = (node.reason or "").strip()
    if node.watchd_owned or reason.startswith(prefix):
        return "watchd"
    if reason.startswith(NHC_PREFIX):
        return "nhc"
    if _slurm_own(reason) is not None or _kubernetes_own(node.taints) is not None:
        return "scheduler"
    if "NOT_RESPONDING" in node.flags and not reason:
        return "scheduler"
    if reason:
        return "admin"
    return "other"


def classify_reason(owner: Owner, node: FleetNode) -> str:
    """A bounded label for the reason (one of :data:`REASON_CLASSES`)."""
    reason = (node.reason or "").strip()
    if owner == "watchd":
        for pattern, cls in _WATCHD_CLASSES:
            if pattern.search(reason):
                return cls
        return "unknown"
    if owner == "nhc":
        return "nhc"
    if owner == "scheduler":
        return _slurm_own(reason) or _kubernetes_own(node.taints) or "not_responding"
    if owner == "admin":
        return "admin"
    return "unknown"


def age_bucket(age_s: float | None) -> str:
    """The bucket of :data:`AGE_BUCKETS` an age falls in (``unknown`` when the time is not known)."""
    if age_s is None:
        return "unknown"
    for label, bound in AGE_BUCKETS:
        if age_s < bound:
            return label
    return AGE_BUCKETS[-1][0]


def unavailable_nodes(
    nodes: Iterable[FleetNode], now: float, prefix: str = WATCHD_REASON_PREFIX
) -> list[Unavailable]:
    """Every node out of service, classified, oldest first (unknown times last), one entry per node (a
    node listed once per partition is merged)."""
    merged: dict[str, FleetNode] = {}
    parts: dict[str, list[str]] = {}
    for n in nodes:
        if n.name not in merged:
            merged[n.name] = n
        parts.setdefault(n.name, []).extend(p for p in n.partitions if p not in parts.get(n.name, ()))
    out: list[Unavailable] = []
    for name, n in merged.items():
        if not n.out_of_service:
            continue
        owner = classify_owner(n, prefix)
        age = None if n.since is None else max(0.0, now - n.since)
        out.append(
            Unavailable(
                node=name,
                scheduler=n.scheduler,
                partitions=tuple(parts[name]),
                state=_describe(n),
                owner=owner,
                reason_class=classify_reason(owner, n),
                reason=n.reason or "",
                user=n.user,
                since=n.since,
                age_s=age,
            )
        )
    out.sort(key=lambda u: (u.since is None, u.since or 0.0, u.node))
    return out


def _describe(n: FleetNode) -> str:
    return "+".join([n.state.upper(), *sorted(n.flags)])


def availability(
    nodes: Iterable[FleetNode], prefix: str = WATCHD_REASON_PREFIX
) -> list[PartitionAvailability]:
    """Per partition: its nodes, how many are out of service (by owner class), and its spares."""
    total: dict[str, set[str]] = {}
    out: dict[str, set[str]] = {}
    spares: dict[str, set[str]] = {}
    owners: dict[str, dict[str, int]] = {}
    for n in nodes:
        for p in n.partitions or ("(none)",):
            if n.name in total.setdefault(p, set()):
                continue
            total[p].add(n.name)
            if n.spare:
                spares.setdefault(p, set()).add(n.name)
            if n.out_of_service:
                out.setdefault(p, set()).add(n.name)
                owner = classify_owner(n, prefix)
                by = owners.setdefault(p, {})
                by[owner] = by.get(owner, 0) + 1
    return [
        PartitionAvailability(
            partition=p,
            total=len(members),
            unavailable=len(out.get(p, ())),
            spares=len(spares.get(p, ())),
            by_owner=dict(owners.get(p, {})),
        )
        for p, members in sorted(total.items())
    ]
