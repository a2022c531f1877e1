"""Active checks on Kubernetes: each check is a batch/v1 Job pinned to its node (``nodeName``: no
scheduler in the way, every GPU of the node requested, ``backoffLimit: 0``, ``activeDeadlineSeconds`` as the
time limit), its output read from its pod's log, its end from the Job's conditions.

Idle here: the node is Ready, not cordoned, has no ``NoSchedule``/``NoExecute`` taint, and no pod on it that
is pending or running asks for GPUs (``checks.kubernetes.gpu_resource``): a running check is such a pod too.
Validation of a node watchd cordoned: the Job tolerates every taint and names the node, so it runs there while
the node stays cordoned; passed: the scheduler adapter's resume (only what watchd did is undone); failed: the
node stays cordoned and watchd's drain record carries the new evidence.

A multi-node run (``nccl-pair``): one Job per node, each pinned to its node, started together. Each pod is
told its place in the environment — ``WATCHD_RANK``, ``WATCHD_WORLD_SIZE``, ``WATCHD_NODES`` (the nodes in
rank order), ``WATCHD_MASTER_NODE`` — for the site's launcher (an ``mpirun``/``torchrun`` wrapper) to meet;
with ``checks.kubernetes.host_network`` the pods use their nodes' network, so rank 0 is reached at its node's
address (and NCCL sees the node's NICs, as nccl-tests across nodes usually needs). Rank 0's Job is the run:
its log is the output, its end the run's end; the others are deleted with it.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Sequence
from typing import Any, cast

from watchd.extras import missing_extra

try:
    from lightkube.resources.batch_v1 import Job
    from lightkube.resources.core_v1 import Node, Pod
    from lightkube.types import CascadeType, PatchType
except ImportError as exc:  # the optional dependency: name the extra, not a traceback
    raise missing_extra("kubernetes", exc) from exc

from watchd.checks.runner import Availability, CheckJob, JobHandle, JobStatus, RunnerError, RunOutput
from watchd.integrations.base import SchedulerError
from watchd.integrations.kubernetes.client import describe_error
from watchd.integrations.kubernetes.scheduler import (
    DRAIN_ANNOTATION,
    DrainRecord,
    KubernetesScheduler,
    node_ready,
    requests_gpu,
    scheduler_from_settings,
)
from watchd.model.nodes import drain_reason

__all__ = ["KubernetesCheckRunner", "runner_from_config"]

_ERRORS = (Exception,)
_CUT = "\n# watchd: output cut at checks.max_output_bytes\n"


def _job_name(job: CheckJob) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", f"watchd-check-{job.check}".lower()).strip("-")[:40]
    return f"{base}-{job.run_id.rsplit('.', 1)[-1][:10]}".strip("-")


def _rank_name(name: str, rank: int) -> str:
    """Rank 0's Job is the run's (its name is the handle's); rank ``r``'s is ``<name>-r<r>``."""
    return name if rank == 0 else f"{name}-r{rank}"


class KubernetesCheckRunner:
    name = "kubernetes"

    def __init__(
        self,
        scheduler: KubernetesScheduler,
        *,
        namespace: str = "watchd",
        image: str = "nvcr.io/nvidia/pytorch:24.04-py3",
        gpu_resource: str = "nvidia.com/gpu",
        gpus: int = 8,
        poll_interval_s: float = 2.0,
        grace_s: float = 30.0,
        max_output_bytes: int = 1024 * 1024,
        host_network: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.host_network = host_network
        self.client = scheduler.client
        self.namespace = namespace
        self.image = image
        self.gpu_resource = gpu_resource
        self.gpus = gpus
        self.poll_interval_s = poll_interval_s
        self.grace_s = grace_s
        self.max_output_bytes = max_output_bytes
        self.created: list[dict[str, Any]] = []  # every Job created (tests assert them)

    async def members(self, partitions: Sequence[str]) -> dict[str, list[str]]:
        try:
            pools = await self.scheduler.pools()
        except SchedulerError as exc:
            raise RunnerError(str(exc)) from exc
        return {p: n for p, n in pools.items() if not partitions or p in partitions}

    async def availability(self, nodes: Sequence[str], within_s: float) -> dict[str, Availability]:
        wanted = set(nodes)
        try:
            all_nodes = [n async for n in self.client.list(Node)]
            pods = [p async for p in self.client.list(Pod, namespace="*")]
        except _ERRORS as exc:
            raise RunnerError(describe_error("LIST nodes/pods", exc)) from exc
        gpu_pods: dict[str, str] = {}
        for p in pods:
            phase = p.status.phase if p.status is not None else None
            node = p.spec.nodeName if p.spec is not None else None
            if node in wanted and phase in ("Pending", "Running") and requests_gpu(p, self.gpu_resource):
                meta = p.metadata
                gpu_pods.setdefault(node, f"GPU pod {meta.namespace}/{meta.name}" if meta else "GPU pod")
        pools = await self.members(())
        parts: dict[str, list[str]] = {}
        for p_name, members in pools.items():
            for m in members:
                parts.setdefault(m, []).append(p_name)
        out: dict[str, Availability] = {}
        for n in all_nodes:
            name = n.metadata.name if n.metadata is not None else None
            if name not in wanted or name is None:
                continue
            taints = [
                t
                for t in (n.spec.taints if n.spec is not None else None) or ()
                if t.effect != "PreferNoSchedule"
            ]
            why = ""
            if not node_ready(n):
                why = "node is not Ready"
            elif n.spec is not None and n.spec.unschedulable:
                why = "cordoned"
            elif taints:
                why = f"tainted {taints[0].key}={taints[0].value or ''}:{taints[0].effect}"
            elif name in gpu_pods:
                why = gpu_pods[name]
            out[name] = Availability(not why, why, tuple(parts.get(name, ())))
        return out

    def _manifest(self, job: CheckJob, name: str, rank: int = 0) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "check", "image": self.image, "command": list(job.argv)}
        if job.peers:
            nodes = job.nodes
            container["env"] = [
                {"name": "WATCHD_RANK", "value": str(rank)},
                {"name": "WATCHD_WORLD_SIZE", "value": str(len(nodes))},
                {"name": "WATCHD_NODES", "value": ",".join(nodes)},
                {"name": "WATCHD_MASTER_NODE", "value": nodes[0]},
            ]
        if self.gpus:
            container["resources"] = {"limits": {self.gpu_resource: str(self.gpus)}}
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": "watchd", "watchd.io/check": job.check},
                "annotations": {
                    "watchd.io/run": job.run_id,
                    "watchd.io/node": job.nodes[rank],
                    "watchd.io/ranks": str(len(job.nodes)),
                },
            },
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": max(1, math.ceil(job.time_limit_s)),
                "ttlSecondsAfterFinished": 86400,
                "template": {
                    "metadata": {
                        "labels": {"app.kubernetes.io/managed-by": "watchd", "watchd.io/check": job.check}
                    },
                    "spec": {
                        "nodeName": job.nodes[rank],
                        "restartPolicy": "Never",
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [container],
                        **({"hostNetwork": True} if self.host_network and job.peers else {}),
                    },
                },
            },
        }

    async def submit(self, job: CheckJob) -> JobHandle:
        name = _job_name(job)
        created: list[str] = []
        for rank in range(len(job.nodes)):
            rank_name = _rank_name(name, rank)
            manifest = self._manifest(job, rank_name, rank)
            self.created.append(manifest)
            try:
                obj = cast(Job, Job.from_dict(manifest))
                await self.client.create(obj)
            except _ERRORS as exc:
                for done in created:  # a group that cannot start whole does not start
                    await self._delete(done)
                raise RunnerError(describe_error(f"POST jobs {rank_name}", exc)) from exc
            created.append(rank_name)
        return JobHandle(
            job.run_id, job.node, name, f"{self.namespace}/{name}", time.time(), job.time_limit_s
        )

    async def _pod_of(self, name: str, job_uid: str | None) -> Pod | None:
        """The Job's pod: labelled with its name and controlled by it (its uid in the pod's owner
        references), so that a pod someone else labelled ``job-name`` never stands in for it."""
        try:
            pods = [
                p async for p in self.client.list(Pod, namespace=self.namespace, labels={"job-name": name})
            ]
        except _ERRORS:
            return None
        owned = [
            p
            for p in pods
            if p.metadata is not None
            and any(o.uid == job_uid and o.controller for o in p.metadata.ownerReferences or ())
        ]
        return owned[0] if owned else None

    async def _log(self, pod: Pod | None) -> str:
        if pod is None or pod.metadata is None or pod.metadata.name is None:
            return ""
        lines: list[str] = []
        size = 0
        try:
            async for line in self.client.log(pod.metadata.name, namespace=self.namespace):
                lines.append(line)
                size += len(line)
                if size > self.max_output_bytes:
                    return "".join(lines)[: self.max_output_bytes] + _CUT
        except _ERRORS:
            return ""
        return "".join(lines)

    async def wait(self, handle: JobHandle) -> RunOutput:
        deadline = handle.submitted_at + handle.time_limit_s + self.grace_s
        name = handle.job_id
        while True:
            try:
                job = await self.client.get(Job, name, namespace=self.namespace)
            except _ERRORS as exc:
                return RunOutput("lost", "", None, describe_error(f"GET jobs {name}", exc), None, name)
            status = job.status
            conditions = {c.type: c for c in (status.conditions if status is not None else None) or ()}
            if "Complete" in conditions or "Failed" in conditions:
                pod = await self._pod_of(name, job.metadata.uid if job.metadata is not None else None)
                output = await self._log(pod)
                exit_code = None
                if pod is not None and pod.status is not None:
                    for cs in pod.status.containerStatuses or ():
                        if cs.state is not None and cs.state.terminated is not None:
                            exit_code = cs.state.terminated.exitCode
                failed = conditions.get("Failed")
                kind: JobStatus = "completed"
                if failed is not None:
                    kind = "timeout" if failed.reason == "DeadlineExceeded" else "failed"
                detail = f"{failed.reason}: {failed.message}" if failed is not None else "Complete"
                annotations = (job.metadata.annotations if job.metadata is not None else None) or {}
                ranks = annotations.get("watchd.io/ranks", "1")
                for rank in range(1, min(int(ranks), 64) if ranks.isdigit() else 1):
                    await self._delete(_rank_name(name, rank))  # the run is rank 0's: the others end with it
                return RunOutput(
                    kind, output, exit_code if "Complete" not in conditions else 0, detail, None, name
                )
            if time.time() > deadline:
                started = status is not None and bool(status.startTime)
                await self.cancel(handle)
                return RunOutput(
                    "timeout" if started else "not_started",
                    "",
                    None,
                    "deleted past its time limit",
                    None,
                    name,
                )
            await asyncio.sleep(self.poll_interval_s)

    async def cancel(self, handle: JobHandle) -> None:
        ranks = 1
        try:
            job = await self.client.get(Job, handle.job_id, namespace=self.namespace)
            annotations = (job.metadata.annotations if job.metadata is not None else None) or {}
            ranks = int(annotations.get("watchd.io/ranks", "1"))
        except (*_ERRORS, ValueError):
            pass
        for rank in range(max(1, min(ranks, 64))):
            await self._delete(_rank_name(handle.job_id, rank))

    async def _delete(self, name: str) -> None:
        try:
            await self.client.delete(Job, name, namespace=self.namespace, cascade=CascadeType.BACKGROUND)
        except _ERRORS:
            return

    async def begin_validation(self, node: str, time_limit_s: float) -> None:
        return None  # the Job names the node and tolerates the taint: the node stays cordoned meanwhile

    async def abandon_validation(self, node: str) -> None:
        return None  # nothing was set up: the node stayed cordoned

    async def lend(self, node: str, partners: Sequence[str]) -> None:
        return None  # nothing to set up: each Job names its node (the partners are in service, idle)

    async def end_validation(self, node: str, passed: bool, reason: str) -> str:
        if passed:
            result = await self.scheduler.resume(node)
            if result.outcome not in ("resumed", "not_drained"):
                raise RunnerError(f"resume of {node}: {result.outcome}: {result.detail}")
            return "resumed"
        try:
            current = await self.client.get(Node, node)
            record = DrainRecord.parse(
                ((current.metadata.annotations if current.metadata else None) or {}).get(DRAIN_ANNOTATION)
            )
            if record is not None:
                new = DrainRecord(drain_reason(reason), record.cordoned, record.tainted, time.time())
                await self.client.patch(
                    Node,
                    node,
                    {"metadata": {"annotations": {DRAIN_ANNOTATION: new.to_json()}}},
                    patch_type=PatchType.MERGE,
                )
        except _ERRORS as exc:
            raise RunnerError(describe_error(f"PATCH nodes/{node}", exc)) from exc
        return "drained"


def runner_from_config(config: Any) -> KubernetesCheckRunner:
    c = config.checks.kubernetes
    return KubernetesCheckRunner(
        scheduler_from_settings(config.kubernetes),
        namespace=c.namespace,
        image=c.image,
        gpu_resource=c.gpu_resource,
        gpus=c.gpus,
        poll_interval_s=c.poll_interval_s,
        grace_s=c.grace,
        max_output_bytes=config.checks.max_output_bytes,
        host_network=c.host_network,
    )
