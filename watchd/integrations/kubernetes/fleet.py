"""The fleet as Kubernetes sees it: every Node (of ``node_selector``) with its pool (the
breaker's ``pool_label``), and why it takes no work: cordoned (``spec.unschedulable``), not ready, or a
``node.kubernetes.io/*`` taint of the control plane. Whose: watchd's when its ``watchd.io/drain``
annotation records the cordon, the control plane's for its own taints, an admin's for any other cordon.

Hot spares are the nodes carrying watchd's spare taint (``watchd.io/spare=<pool>:NoSchedule``): pods that
do not tolerate it are not placed there; releasing a spare removes the taint. A node with a running pod
(not a DaemonSet's) is never made a spare."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence
from typing import Any

from watchd.extras import missing_extra

try:
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Node, Pod
    from lightkube.types import PatchType
except ImportError as exc:  # the optional dependency: name the extra, not a traceback
    raise missing_extra("kubernetes", exc) from exc

from watchd.integrations.base import SchedulerError
from watchd.integrations.kubernetes.client import API_ERRORS, describe_error, label_selector
from watchd.integrations.kubernetes.scheduler import (
    DRAIN_ANNOTATION,
    DrainRecord,
    KubernetesScheduler,
    node_ready,
)
from watchd.model.fleet import KUBERNETES_OWN_TAINTS, FleetNode

SPARE_TAINT = "watchd.io/spare"


def _time_added(taint: Any) -> float | None:
    added = getattr(taint, "timeAdded", None)
    if isinstance(added, dt.datetime):
        return added.timestamp()
    if isinstance(added, str):
        try:
            return dt.datetime.fromisoformat(added.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def fleet_node_of(node: Node, pool_label: str, busy: set[str], prefix: str = "watchd:") -> FleetNode:
    meta = node.metadata or ObjectMeta()
    name = meta.name or ""
    spec = node.spec
    taints = list((spec.taints if spec is not None else None) or ())
    keys = tuple(t.key for t in taints if t.effect in ("NoSchedule", "NoExecute"))
    cordoned = bool(spec is not None and spec.unschedulable)
    record = DrainRecord.parse((meta.annotations or {}).get(DRAIN_ANNOTATION))
    ours = record is not None and cordoned and record.cordoned and record.reason.startswith(prefix)
    own = [
        t for t in taints if t.key in KUBERNETES_OWN_TAINTS and t.key != "node.kubernetes.io/unschedulable"
    ]
    reason: str | None = None
    since: float | None = None
    if ours and record is not None:
        reason, since = record.reason, record.at
    elif own:
        reason, since = own[0].key, _time_added(own[0])
    elif cordoned:
        reason = "cordoned"
        since = next((_time_added(t) for t in taints if t.key == "node.kubernetes.io/unschedulable"), None)
    ready = node_ready(node)
    flags = set()
    if cordoned:
        flags.add("CORDONED")
    if own and not ours:
        flags.add("FAIL")
    spare = SPARE_TAINT in keys
    if spare:
        flags.add("RESERVED")
    state = "down" if not ready else ("allocated" if name in busy else "idle")
    pool = (meta.labels or {}).get(pool_label) or "default"
    return FleetNode(
        name=name,
        scheduler="kubernetes",
        partitions=(pool,),
        state=state,
        flags=frozenset(flags),
        reason=reason,
        since=since,
        watchd_owned=ours,
        spare=spare,
        taints=keys,
    )


class KubernetesFleet:
    """The :class:`~watchd.integrations.fleet.FleetBackend` of a :class:`KubernetesScheduler`."""

    name = "kubernetes"

    def __init__(self, scheduler: KubernetesScheduler) -> None:
        self.scheduler = scheduler

    async def _nodes(self) -> list[Node]:
        s = self.scheduler
        try:
            return [n async for n in s.client.list(Node, labels=label_selector(s.node_selector))]
        except API_ERRORS as exc:
            raise SchedulerError(describe_error("LIST nodes", exc)) from exc

    async def _busy(self) -> set[str]:
        """Nodes with a running pod that is not a DaemonSet's."""
        try:
            pods = [
                p
                async for p in self.scheduler.client.list(
                    Pod, namespace="*", fields={"status.phase": "Running"}
                )
            ]
        except API_ERRORS as exc:
            raise SchedulerError(describe_error("LIST pods (status.phase=Running)", exc)) from exc
        busy: set[str] = set()
        for pod in pods:
            meta = pod.metadata or ObjectMeta()
            if any(ref.kind == "DaemonSet" for ref in meta.ownerReferences or ()):
                continue
            if pod.spec is not None and pod.spec.nodeName:
                busy.add(pod.spec.nodeName)
        return busy

    async def fleet_nodes(self) -> list[FleetNode]:
        nodes, busy = await asyncio.gather(self._nodes(), self._busy())
        s = self.scheduler
        return [fleet_node_of(n, s.pool_label, busy, s.reason_prefix) for n in nodes]

    async def pending(self, jobs: Sequence[str]) -> set[str]:
        """An evicted pod is not started again: its controller makes a new one, which the scheduler places
        within seconds (no requeue delay as in Slurm). Nothing is waited for."""
        return set()

    async def spares(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in await self.fleet_nodes():
            if n.spare:
                out.setdefault(n.partitions[0], []).append(n.name)
        return out

    async def set_spares(self, partition: str, nodes: Sequence[str]) -> None:
        fleet = {n.name: n for n in await self.fleet_nodes()}
        wanted = set(nodes)
        for name in wanted:
            n = fleet.get(name)
            if n is None:
                raise SchedulerError(f"spares of {partition}: unknown node {name}")
            if not n.spare and not n.idle:
                raise SchedulerError(f"spares of {partition}: {name} is busy or out of service")
        for name, n in fleet.items():
            if n.partitions != (partition,):
                continue
            if (name in wanted) != n.spare:
                await self._set_taint(name, name in wanted, partition)

    async def _set_taint(self, name: str, on: bool, partition: str) -> None:
        client = self.scheduler.client
        try:
            node = await client.get(Node, name)
            taints = [t.to_dict() for t in (node.spec.taints if node.spec is not None else None) or ()]
            taints = [t for t in taints if t.get("key") != SPARE_TAINT]
            if on:
                taints.append({"key": SPARE_TAINT, "value": partition[:63], "effect": "NoSchedule"})
            meta = node.metadata or ObjectMeta()
            patch = {
                "metadata": {"resourceVersion": meta.resourceVersion},
                "spec": {"taints": taints or None},
            }
            await client.patch(Node, name, patch, patch_type=PatchType.MERGE)
        except API_ERRORS as exc:
            raise SchedulerError(describe_error(f"PATCH nodes/{name} (spare taint)", exc)) from exc


def fleet_of(scheduler: KubernetesScheduler) -> KubernetesFleet:
    return KubernetesFleet(scheduler)
