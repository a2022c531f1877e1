"""Kubernetes jobs: which job a pod belongs to (JobSet, Kubeflow training jobs, batch Jobs), and a
:class:`~watchd.jobs.model.JobProvider` that lists the running ones from the pods.

Recognized, most specific first (a JobSet's pods also belong to its child Jobs, a Kubeflow job's pods to
nothing else):

- JobSet: label ``jobset.sigs.k8s.io/jobset-name``;
- Kubeflow training operator (PyTorchJob, MPIJob, TFJob, ...): label ``training.kubeflow.org/job-name``, the
  kind from the controlling owner reference (PyTorchJob when there is none);
- batch/v1 Job: the controlling owner reference of kind Job, or the label ``batch.kubernetes.io/job-name``
  (Kubernetes 1.27+) / ``job-name`` (older).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from watchd.jobs.model import JobInfo
from watchd.model.jobs import pod_job_label

JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
KUBEFLOW_LABEL = "training.kubeflow.org/job-name"
JOB_LABELS = ("batch.kubernetes.io/job-name", "job-name")


@dataclass(frozen=True, slots=True)
class JobRef:
    kind: str  # JobSet, PyTorchJob, Job, ...
    namespace: str
    name: str
    selector: str | None  # a label selector that finds all the job's pods (None: by owner reference only)

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodLike(Protocol):
    """The few fields of a pod this module reads (lightkube's Pod model has them)."""

    @property
    def metadata(self) -> Any: ...


def _controller(owners: Sequence[Any] | None) -> Any:
    for ref in owners or ():
        if getattr(ref, "controller", False):
            return ref
    return None


def job_of_pod(pod: PodLike) -> JobRef | None:
    meta = pod.metadata
    ns = meta.namespace or "default"
    labels: Mapping[str, str] = meta.labels or {}
    owner = _controller(meta.ownerReferences)
    if JOBSET_LABEL in labels:
        name = labels[JOBSET_LABEL]
        return JobRef("JobSet", ns, name, f"{JOBSET_LABEL}={name}")
    if KUBEFLOW_LABEL in labels:
        name = labels[KUBEFLOW_LABEL]
        kind = owner.kind if owner is not None and owner.kind != "Job" else "PyTorchJob"
        return JobRef(kind, ns, name, f"{KUBEFLOW_LABEL}={name}")
    for label in JOB_LABELS:
        if label in labels:
            return JobRef("Job", ns, labels[label], f"{label}={labels[label]}")
    if owner is not None and owner.kind == "Job":
        return JobRef("Job", ns, owner.name, None)
    return None


def owned_by(pod: PodLike, ref: JobRef) -> bool:
    return job_of_pod(pod) == ref


def jobs_from_pods(pods: Sequence[Any]) -> list[JobInfo]:
    """Running pods -> one JobInfo per job, its nodes in the order first seen."""
    nodes: dict[JobRef, dict[str, None]] = {}
    uids: dict[JobRef, list[str]] = {}
    for pod in pods:
        ref = job_of_pod(pod)
        node = pod.spec.nodeName if pod.spec is not None else None
        if ref is None or not node:
            continue
        nodes.setdefault(ref, {})[node] = None
        named = pod_job_label(pod.metadata.namespace or "default", getattr(pod.metadata, "name", "") or "")
        if named is not None and named != f"k8s:{ref.id}":  # what dcgm-exporter's pod labels give
            uids.setdefault(ref, []).append(named)
        uid = getattr(pod.metadata, "uid", None)
        if uid:
            uids.setdefault(ref, []).append(f"k8s:{str(uid).lower()}")  # the agents' label of the pod
    return [
        JobInfo(
            id=f"k8s:{ref.id}",
            nodes=tuple(ns),
            source="kubernetes",
            name=f"{ref.kind}/{ref.name}",
            aliases=tuple(uids.get(ref, ())),
        )
        for ref, ns in nodes.items()
    ]


class KubernetesJobProvider:
    """The running jobs from the pods (phase Running), across namespaces or in ``namespace``."""

    name = "kubernetes"

    def __init__(self, client: Any, *, namespace: str = "*", label_selector: str | None = None) -> None:
        self.client = client
        self.namespace = namespace
        self.label_selector = label_selector

    async def running_jobs(self) -> list[JobInfo]:
        from lightkube.resources.core_v1 import Pod

        from watchd.integrations.kubernetes.client import API_ERRORS, describe_error, label_selector
        from watchd.jobs.model import JobProviderError

        try:
            pods = [
                p
                async for p in self.client.list(
                    Pod,
                    namespace=self.namespace,
                    fields={"status.phase": "Running"},
                    labels=label_selector(self.label_selector),
                )
            ]
        except API_ERRORS as exc:
            raise JobProviderError(describe_error("LIST pods (status.phase=Running)", exc)) from exc
        return jobs_from_pods(pods)
