"""Kubernetes scheduler adapter: cordon, taint and evict; requeue by deleting a job's pods; resume only what
watchd did. Through lightkube (asynchronous; see docs/kubernetes.md for the choice).

How a node maps to :class:`~watchd.model.nodes.NodeState`, so that the shared safety decisions
(``plan_drain``, ``refuse_resume``) apply unchanged:

- cordoned (``spec.unschedulable``) = the ``DRAIN`` flag;
- the reason: watchd's own (it carries watchd's prefix) when the node annotation ``watchd.io/drain`` says
  watchd cordoned it; otherwise ``cordoned, not by watchd`` (no prefix: the node is never touched);
- ``Ready`` False or Unknown = state ``notready``, not ``down``: a NotReady GPU node comes back with its
  faulty GPU, so it is cordoned too (the node controller's own not-ready taint goes away when it is back).

A drain patches the node once (merge patch carrying ``metadata.resourceVersion``: a concurrent writer makes it
409, and the node is read again and decided again), then evicts its pods in the background through the
Eviction API: DaemonSet, mirror and finished pods are skipped, optionally every pod that requests no GPU; a
429 from a PodDisruptionBudget is retried with backoff up to a deadline, then reported (and the pod deleted,
when ``delete_after_deadline``). The eviction report lands in the node annotation ``watchd.io/eviction``,
the log and ``eviction_reports``. Evicting in the background keeps the time to cordon independent of how
long a budget holds a pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from watchd.extras import missing_extra

try:
    from httpx2 import HTTPStatusError
    from lightkube import AsyncClient
    from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
    from lightkube.resources.core_v1 import Node, Pod, PodEviction
    from lightkube.types import PatchType
except ImportError as exc:  # the optional dependency: name the extra, not a traceback
    raise missing_extra("kubernetes", exc) from exc

from watchd.integrations.base import (
    SCHEDULER_VERBS,
    PlannedDrain,
    Privileges,
    RequeueResult,
    SchedulerError,
    job_selected,
)
from watchd.integrations.kubernetes.client import API_ERRORS, describe_error, label_selector, status_code
from watchd.integrations.kubernetes.jobs import JobRef, KubernetesJobProvider, job_of_pod, owned_by
from watchd.integrations.kubernetes.reboot import ask_reboot, boot_id_of, reboot_flags
from watchd.integrations.kubernetes.settings import KubernetesConfig
from watchd.jobs.model import JobProvider
from watchd.logs import get_logger
from watchd.model.nodes import (
    WATCHD_REASON_PREFIX,
    DrainResult,
    NodeState,
    RebootResult,
    ResumeResult,
    drain_reason,
    plan_drain,
    refuse_reboot,
    refuse_resume,
)

_log = get_logger("watchd.kubernetes")

DRAIN_ANNOTATION = "watchd.io/drain"
EVICTION_ANNOTATION = "watchd.io/eviction"
REQUEUE_ANNOTATION = "watchd.io/requeue-requested"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
FOREIGN_CORDON = "cordoned, not by watchd"
_CONFLICT_RETRIES = 5
RequeueMode = Literal["delete", "annotate"]


#: what watchd changes on Kubernetes, as RBAC names it: (verb, resource, subresource)
_CHANGES = (("patch", "nodes", None), ("create", "pods", "eviction"))


@dataclass(frozen=True, slots=True)
class DrainRecord:
    """What watchd did to a node (the ``watchd.io/drain`` annotation): resume undoes exactly this."""

    reason: str
    cordoned: bool
    tainted: bool
    at: float

    def to_json(self) -> str:
        return json.dumps(
            {"reason": self.reason, "cordoned": self.cordoned, "tainted": self.tainted, "at": self.at},
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, text: str | None) -> DrainRecord | None:
        if not text:
            return None
        try:
            d = json.loads(text)
            return cls(str(d["reason"]), bool(d["cordoned"]), bool(d["tainted"]), float(d["at"]))
        except (ValueError, KeyError, TypeError):
            return None  # not ours, or mangled by hand: treat as absent (never resume on it)


@dataclass
class EvictionReport:
    node: str
    evicted: list[str] = field(default_factory=list)  # namespace/name
    deleted: list[str] = field(default_factory=list)  # deleted after the deadline
    blocked: list[str] = field(default_factory=list)  # a disruption budget held them past the deadline
    skipped: dict[str, str] = field(default_factory=dict)  # pod -> why (DaemonSet, mirror, no GPU, ...)
    failed: dict[str, str] = field(default_factory=dict)  # pod -> error
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "evicted": len(self.evicted),
            "deleted": self.deleted,
            "blocked": self.blocked,
            "failed": self.failed,
            "skipped": len(self.skipped),
            "seconds": round(self.seconds, 3),
        }


def node_ready(node: Node) -> bool:
    for cond in (node.status.conditions if node.status is not None else None) or ():
        if cond.type == "Ready":
            return cond.status == "True"
    return True  # no Ready condition reported (yet): not evidence of a fault


def node_state_of(node: Node, prefix: str = WATCHD_REASON_PREFIX) -> NodeState:
    meta = node.metadata or ObjectMeta()
    record = DrainRecord.parse((meta.annotations or {}).get(DRAIN_ANNOTATION))
    cordoned = bool(node.spec is not None and node.spec.unschedulable)
    flags = frozenset({"DRAIN"} if cordoned else ()) | reboot_flags(node)
    reason: str | None = None
    if cordoned:
        ours = record is not None and record.cordoned and record.reason.startswith(prefix)
        reason = record.reason if ours and record is not None else FOREIGN_CORDON
    state = "ready" if node_ready(node) else "notready"
    return NodeState(name=meta.name or "", state=state, flags=flags, reason=reason, boot_id=boot_id_of(node))


def taint_value(reason: str, prefix: str = WATCHD_REASON_PREFIX) -> str:
    """A taint value from a reason: label-value syntax (alphanumerics, ``-_.``, at most 63, alphanumeric at
    both ends). ``watchd: Xid 79 on GPU 0`` -> ``Xid-79-on-GPU-0``."""
    text = reason.removeprefix(prefix).strip()
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", text)


def pod_name(pod: Pod) -> str:
    meta = pod.metadata or ObjectMeta()
    return f"{meta.namespace}/{meta.name}"


def requests_gpu(pod: Pod, resource: str) -> bool:
    for c in (pod.spec.containers if pod.spec is not None else None) or ():
        res = c.resources
        if res is not None and (resource in (res.limits or {}) or resource in (res.requests or {})):
            return True
    return False


def why_not_evicted(pod: Pod, *, gpu_only: bool, gpu_resource: str) -> str | None:
    """Why a pod on a drained node is left alone, or None when it is to be evicted."""
    meta = pod.metadata or ObjectMeta()
    if MIRROR_ANNOTATION in (meta.annotations or {}):
        return "mirror pod (static, managed by the kubelet)"
    if any(ref.kind == "DaemonSet" for ref in meta.ownerReferences or ()):
        return "DaemonSet pod"
    phase = pod.status.phase if pod.status is not None else None
    if phase in ("Succeeded", "Failed"):
        return f"finished ({phase})"
    if gpu_only and not requests_gpu(pod, gpu_resource):
        return f"requests no {gpu_resource}"
    return None


class KubernetesScheduler(PlannedDrain):
    """The real :class:`~watchd.integrations.base.Scheduler` for Kubernetes."""

    name = "kubernetes"
    verbs = SCHEDULER_VERBS

    def __init__(
        self,
        client: AsyncClient,
        *,
        reason_prefix: str = WATCHD_REASON_PREFIX,
        taint_key: str = "watchd.io/gpu-fault",
        taint_effect: str = "NoSchedule",
        pool_label: str = "nvidia.com/gpu.product",
        node_selector: str | None = None,
        eviction_deadline_s: float = 300.0,
        eviction_backoff_s: tuple[float, float] = (1.0, 10.0),
        gpu_only: bool = False,
        gpu_resource: str = "nvidia.com/gpu",
        delete_after_deadline: bool = False,
        requeue: RequeueMode = "delete",
        max_concurrency: int = 16,
        on_eviction: Callable[[EvictionReport], None] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self._jobs = KubernetesJobProvider(client)
        self.reason_prefix = reason_prefix
        self.taint_key = taint_key
        self.taint_effect = taint_effect
        self.pool_label = pool_label
        self.node_selector = node_selector
        self.eviction_deadline_s = eviction_deadline_s
        self.eviction_backoff_s = eviction_backoff_s
        self.gpu_only = gpu_only
        self.gpu_resource = gpu_resource
        self.delete_after_deadline = delete_after_deadline
        self.requeue_mode: RequeueMode = requeue
        self.on_eviction = on_eviction
        self.eviction_reports: dict[str, EvictionReport] = {}
        self._wall = wall
        self._sem = asyncio.Semaphore(max_concurrency)
        self._seen: dict[str, Node] = {}  # the latest copy of each node read (its resourceVersion)
        self._evictions: dict[str, asyncio.Task[EvictionReport]] = {}

    def job_providers(self) -> list[JobProvider]:
        return [self._jobs]  # the jobs are the owners of the pods on the nodes

    async def aclose(self) -> None:
        for task in self._evictions.values():
            task.cancel()
        await asyncio.gather(*self._evictions.values(), return_exceptions=True)
        await self.client.close()

    async def wait_evictions(self) -> dict[str, EvictionReport]:
        """Wait for the evictions in progress (tests, benchmarks, shutdown)."""
        await asyncio.gather(*self._evictions.values(), return_exceptions=True)
        return dict(self.eviction_reports)

    # ------------------------------------------------------------------------------------------ reads
    async def _get_node(self, name: str) -> Node | None:
        async with self._sem:
            try:
                node = await self.client.get(Node, name)
            except HTTPStatusError as exc:
                if status_code(exc) == 404:
                    self._seen.pop(name, None)
                    return None
                raise SchedulerError(describe_error(f"GET nodes/{name}", exc)) from exc
            except API_ERRORS as exc:
                raise SchedulerError(describe_error(f"GET nodes/{name}", exc)) from exc
        self._seen[name] = node
        return node

    async def node_states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        wanted = list(dict.fromkeys(nodes))
        found = await asyncio.gather(*(self._get_node(n) for n in wanted))
        pairs = zip(wanted, found, strict=True)
        return {n: node_state_of(node, self.reason_prefix) for n, node in pairs if node is not None}

    async def pools(self) -> dict[str, list[str]]:
        try:
            nodes = [n async for n in self.client.list(Node, labels=label_selector(self.node_selector))]
        except API_ERRORS as exc:
            raise SchedulerError(describe_error("LIST nodes", exc)) from exc
        members: dict[str, list[str]] = {}
        for node in nodes:
            meta = node.metadata or ObjectMeta()
            pool = (meta.labels or {}).get(self.pool_label) or "default"
            members.setdefault(pool, []).append(meta.name or "")
        return members

    async def _pods_on(self, node: str) -> list[Pod]:
        try:
            return [p async for p in self.client.list(Pod, namespace="*", fields={"spec.nodeName": node})]
        except API_ERRORS as exc:
            raise SchedulerError(describe_error(f"LIST pods (spec.nodeName={node})", exc)) from exc

    # ------------------------------------------------------------------------------------------ drain
    async def apply_drain(self, groups: Mapping[str, Sequence[str]]) -> dict[str, DrainResult]:
        todo = [(n, reason) for reason, names in groups.items() for n in names]
        done = await asyncio.gather(*(self._cordon(n, reason) for n, reason in todo))
        results: dict[str, DrainResult] = {}
        for (node, reason), result in zip(todo, done, strict=True):
            results[node] = result
            if result.outcome == "drained":
                self._start_eviction(node, reason)
        return results

    async def _cordon(self, name: str, reason: str) -> DrainResult:
        node = self._seen.get(name)
        for attempt in range(_CONFLICT_RETRIES):
            if node is None or attempt > 0:
                try:
                    node = await self._get_node(name)
                except SchedulerError as exc:
                    return DrainResult(name, "failed", str(exc))
                if node is None:
                    return DrainResult(name, "failed", "unknown node (deleted?)")
                # someone wrote the node meanwhile: decide again on what is there now
                settled, _ = plan_drain(
                    {name: reason}, {name: node_state_of(node, self.reason_prefix)}, self.reason_prefix
                )
                if name in settled:
                    return settled[name]
            patch = self._drain_patch(node, reason)
            try:
                async with self._sem:
                    patched = await self.client.patch(Node, name, patch, patch_type=PatchType.MERGE)
            except HTTPStatusError as exc:
                if status_code(exc) == 409:
                    continue
                return DrainResult(name, "failed", describe_error(f"PATCH nodes/{name}", exc))
            except API_ERRORS as exc:
                return DrainResult(name, "failed", describe_error(f"PATCH nodes/{name}", exc))
            self._seen[name] = patched
            return DrainResult(name, "drained", reason)
        return DrainResult(
            name, "failed", f"PATCH nodes/{name}: {_CONFLICT_RETRIES} conflicts in a row (409)"
        )

    def _drain_patch(self, node: Node, reason: str) -> dict[str, Any]:
        meta = node.metadata or ObjectMeta()
        taints = [t.to_dict() for t in (node.spec.taints if node.spec is not None else None) or ()]
        has_taint = any(t.get("key") == self.taint_key for t in taints)
        if not has_taint:
            taints.append(
                {
                    "key": self.taint_key,
                    "value": taint_value(reason, self.reason_prefix),
                    "effect": self.taint_effect,
                }
            )
        record = DrainRecord(reason=reason, cordoned=True, tainted=not has_taint, at=self._wall())
        return {
            "metadata": {
                "resourceVersion": meta.resourceVersion,
                "annotations": {DRAIN_ANNOTATION: record.to_json(), EVICTION_ANNOTATION: None},
            },
            "spec": {"unschedulable": True, "taints": taints},
        }

    # ------------------------------------------------------------------------------------------ evict
    def _start_eviction(self, node: str, reason: str) -> None:
        previous = self._evictions.get(node)
        if previous is not None and not previous.done():
            return
        self._evictions[node] = asyncio.create_task(self._evict_node(node), name=f"evict-{node}")

    async def _evict_node(self, node: str) -> EvictionReport:
        report = EvictionReport(node)
        start = time.monotonic()
        try:
            pods = await self._pods_on(node)
        except SchedulerError as exc:
            report.failed["*"] = str(exc)
            pods = []
        to_evict = []
        for pod in pods:
            why = why_not_evicted(pod, gpu_only=self.gpu_only, gpu_resource=self.gpu_resource)
            if why is None:
                to_evict.append(pod)
            else:
                report.skipped[pod_name(pod)] = why
        deadline = start + self.eviction_deadline_s
        results = await asyncio.gather(
            *(self._evict_pod(pod, deadline, report) for pod in to_evict), return_exceptions=True
        )
        for pod, result in zip(to_evict, results, strict=True):
            if isinstance(result, Exception):  # an adapter bug must not lose the report
                report.failed[pod_name(pod)] = f"internal error: {result!r}"
        report.seconds = time.monotonic() - start
        self.eviction_reports[node] = report
        _log.info("evicted", node=node, **report.summary())
        await self._annotate_node(
            node, {EVICTION_ANNOTATION: json.dumps(report.summary(), separators=(",", ":"))}
        )
        if self.on_eviction is not None:
            self.on_eviction(report)
        return report

    async def _evict_pod(self, pod: Pod, deadline: float, report: EvictionReport) -> None:
        meta = pod.metadata or ObjectMeta()
        name, ns = meta.name or "", meta.namespace or "default"
        key = f"{ns}/{name}"
        eviction = PodEviction(metadata=ObjectMeta(name=name, namespace=ns))
        delay, max_delay = self.eviction_backoff_s
        while True:
            try:
                async with self._sem:
                    await self.client.create(eviction, name, namespace=ns)
            except HTTPStatusError as exc:
                code = status_code(exc)
                if code == 404:  # gone already
                    report.evicted.append(key)
                    return
                if code == 429 or (code is not None and code >= 500):
                    # 429: a disruption budget forbids it now; 5xx: the API server is struggling
                    if time.monotonic() + delay < deadline:
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, max_delay)
                        continue
                    if code == 429:
                        report.blocked.append(key)
                        if self.delete_after_deadline:
                            await self._delete_pod(ns, name, report)
                        return
                report.failed[key] = describe_error(f"POST pods/{key}/eviction", exc)
                return
            except API_ERRORS as exc:
                report.failed[key] = describe_error(f"POST pods/{key}/eviction", exc)
                return
            report.evicted.append(key)
            return

    async def _delete_pod(self, ns: str, name: str, report: EvictionReport) -> None:
        key = f"{ns}/{name}"
        try:
            async with self._sem:
                await self.client.delete(Pod, name, namespace=ns)
        except HTTPStatusError as exc:
            if status_code(exc) != 404:
                report.failed[key] = describe_error(f"DELETE pods/{key}", exc)
                return
        except API_ERRORS as exc:
            report.failed[key] = describe_error(f"DELETE pods/{key}", exc)
            return
        report.deleted.append(key)

    async def _annotate_node(self, node: str, annotations: Mapping[str, str | None]) -> None:
        with contextlib.suppress(*API_ERRORS):  # best effort: the report is also logged and kept
            async with self._sem:
                await self.client.patch(
                    Node, node, {"metadata": {"annotations": dict(annotations)}}, patch_type=PatchType.MERGE
                )

    # ------------------------------------------------------------------------------------------ requeue
    async def requeue_jobs_on(self, node: str, job: str | None = None) -> RequeueResult:
        pods = await self._pods_on(node)
        jobs: dict[JobRef, None] = {}
        not_requeueable: dict[str, None] = {}
        for pod in pods:
            if why_not_evicted(pod, gpu_only=False, gpu_resource=self.gpu_resource) is not None:
                continue
            ref = job_of_pod(pod)
            if ref is None:
                if job is None:  # a bare pod or a service: nothing would restart it
                    not_requeueable[pod_name(pod)] = None
            elif job_selected(job, ref.id, f"k8s:{ref.id}"):
                jobs[ref] = None
        results = await asyncio.gather(*(self._requeue(ref, node) for ref in jobs))
        failed = {ref.id: err for ref, err in zip(jobs, results, strict=True) if err is not None}
        done = tuple(ref.id for ref in jobs if ref.id not in failed)
        return RequeueResult(node, done, tuple(not_requeueable), failed)

    async def _requeue(self, ref: JobRef, node: str) -> str | None:
        """Delete (or annotate) every pod of the job, on every node: its controller restarts the job."""
        try:
            pods = [
                p
                async for p in self.client.list(
                    Pod, namespace=ref.namespace, labels=label_selector(ref.selector)
                )
                if owned_by(p, ref)
            ]
        except API_ERRORS as exc:
            return describe_error(f"LIST pods of {ref.kind} {ref.id}", exc)
        errors = []
        for pod in pods:
            name = (pod.metadata or ObjectMeta()).name or ""
            try:
                async with self._sem:
                    if self.requeue_mode == "annotate":
                        value = json.dumps({"node": node, "at": self._wall()}, separators=(",", ":"))
                        await self.client.patch(
                            Pod,
                            name,
                            {"metadata": {"annotations": {REQUEUE_ANNOTATION: value}}},
                            namespace=ref.namespace,
                            patch_type=PatchType.MERGE,
                        )
                    else:
                        await self.client.delete(Pod, name, namespace=ref.namespace)
            except HTTPStatusError as exc:
                if status_code(exc) != 404:
                    errors.append(
                        describe_error(
                            f"{'PATCH' if self.requeue_mode == 'annotate' else 'DELETE'} "
                            f"pods/{ref.namespace}/{name}",
                            exc,
                        )
                    )
            except API_ERRORS as exc:
                errors.append(describe_error(f"DELETE pods/{ref.namespace}/{name}", exc))
        return "; ".join(errors) or None

    # ------------------------------------------------------------------------------------- privileges
    async def privileges(self) -> Privileges:
        """SelfSubjectAccessReview for each change watchd makes: cordon and taint a node (patch nodes),
        evict a pod (create pods/eviction); the API server answers from RBAC and changes nothing."""
        refused = []
        for verb, resource, sub in _CHANGES:
            review = SelfSubjectAccessReview(
                spec=SelfSubjectAccessReviewSpec(
                    resourceAttributes=ResourceAttributes(verb=verb, resource=resource, subresource=sub)
                )
            )
            try:
                answer = await self.client.create(review)
            except API_ERRORS as exc:
                return Privileges(None, describe_error("could not ask (POST selfsubjectaccessreviews)", exc))
            status = answer.status
            if status is None or not status.allowed:
                what = f"{verb} {resource}{'/' + sub if sub else ''}"
                refused.append(what + (f" ({status.reason})" if status is not None and status.reason else ""))
        if refused:
            return Privileges(False, "RBAC refuses watchd's service account: " + "; ".join(refused))
        return Privileges(True, "RBAC lets watchd cordon, taint and evict")

    # ------------------------------------------------------------------------------------------ resume
    async def reboot(self, node: str, reason: str) -> RebootResult:
        current = await self._get_node(node)
        st = node_state_of(current, self.reason_prefix) if current is not None else None
        refusal = refuse_reboot(st, node, self.reason_prefix)
        if refusal is not None or current is None:
            return refusal or RebootResult(node, "failed", "unknown node")
        async with self._sem:
            return await ask_reboot(self.client, current, drain_reason(reason, self.reason_prefix))

    async def resume(self, node: str) -> ResumeResult:
        evicting = self._evictions.get(node)
        if evicting is not None and not evicting.done():
            evicting.cancel()  # back in service: stop taking its pods away
        for _ in range(_CONFLICT_RETRIES):
            current = await self._get_node(node)
            st = node_state_of(current, self.reason_prefix) if current is not None else None
            refusal = refuse_resume(st, node, self.reason_prefix)
            if refusal is not None:
                return refusal
            assert current is not None and st is not None
            meta = current.metadata or ObjectMeta()
            record = DrainRecord.parse((meta.annotations or {}).get(DRAIN_ANNOTATION))
            assert record is not None  # refuse_resume passed: the reason came from the record
            spec: dict[str, Any] = {}
            if record.cordoned:
                spec["unschedulable"] = None
            if record.tainted:
                taints = [
                    t.to_dict() for t in (current.spec.taints if current.spec is not None else None) or ()
                ]
                spec["taints"] = [t for t in taints if t.get("key") != self.taint_key] or None
            patch = {
                "metadata": {
                    "resourceVersion": meta.resourceVersion,
                    "annotations": {DRAIN_ANNOTATION: None, EVICTION_ANNOTATION: None},
                },
                "spec": spec,
            }
            try:
                async with self._sem:
                    self._seen[node] = await self.client.patch(Node, node, patch, patch_type=PatchType.MERGE)
            except HTTPStatusError as exc:
                if status_code(exc) == 409:
                    continue
                return ResumeResult(node, "failed", describe_error(f"PATCH nodes/{node}", exc))
            except API_ERRORS as exc:
                return ResumeResult(node, "failed", describe_error(f"PATCH nodes/{node}", exc))
            return ResumeResult(node, "resumed", st.reason or "")
        return ResumeResult(
            node, "failed", f"PATCH nodes/{node}: {_CONFLICT_RETRIES} conflicts in a row (409)"
        )


def scheduler_from_settings(cfg: KubernetesConfig) -> KubernetesScheduler:
    from watchd.integrations.kubernetes.client import make_client

    ev = cfg.eviction
    return KubernetesScheduler(
        make_client(cfg.kubeconfig, cfg.context, in_cluster=cfg.in_cluster, timeout_s=cfg.timeout_s),
        taint_key=cfg.taint_key,
        taint_effect=cfg.taint_effect,
        pool_label=cfg.pool_label,
        node_selector=cfg.node_selector,
        eviction_deadline_s=ev.deadline_s,
        eviction_backoff_s=(ev.backoff_initial_s, ev.backoff_max_s),
        gpu_only=ev.gpu_only,
        gpu_resource=ev.gpu_resource,
        delete_after_deadline=ev.delete_after_deadline,
        requeue=cfg.requeue,
        max_concurrency=cfg.max_concurrency,
    )
