"""Job labels: how agents and the engine name a job (``slurm:1234``, ``k8s:<pod-uid>``). Pure; the agent's
``/proc`` resolver (:mod:`watchd.gpu.jobs`) produces them, the engine and the detectors read them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["JobKind", "JobRef", "job_label", "parse_job_label", "pod_job_label"]

JobKind = Literal["slurm", "k8s"]

# Pod UIDs are UUIDs; static (mirror) pods use a 32-hex config hash. Both are hex with optional dashes.
K8S_UID_RE = re.compile(r"[0-9a-fA-F][0-9a-fA-F-]{7,63}", re.ASCII)


@dataclass(frozen=True, slots=True)
class JobRef:
    kind: JobKind
    id: str  # Slurm job id (digits) or Kubernetes pod UID (lower case, with dashes)

    @property
    def label(self) -> str:
        """``slurm:1234`` or ``k8s:<pod-uid>``."""
        return f"{self.kind}:{self.id}"

    def __str__(self) -> str:
        return self.label


def parse_job_label(label: str) -> JobRef | None:
    """The inverse of :attr:`JobRef.label`; None when ``label`` is not one."""
    kind, sep, ident = label.partition(":")
    if not sep or not ident:
        return None
    if kind == "slurm" and ident.isascii() and ident.isdigit():
        return JobRef("slurm", ident)
    if kind == "k8s" and K8S_UID_RE.fullmatch(ident):
        return JobRef("k8s", ident.lower())
    return None


def job_label(value: object) -> str | None:
    """A job as the agents label it; a bare Slurm job id (``1234``: SLURM_JOB_ID) becomes ``slurm:1234``."""
    if value is None:
        return None
    text = str(value)
    if text.startswith("slurm:") and text[6:].isdigit() and text.isascii():  # the common case, at once
        return text
    if parse_job_label(text) is not None:
        return text
    if text.isascii() and text.isdigit():
        return f"slurm:{text}"
    return text or None


# Kubernetes generated-name suffix (5 characters of this alphabet), Indexed-Job index, Kubeflow replica.
_POD_SUFFIX_RE = re.compile(r"-[bcdfghjklmnpqrstvwxz2456789]{5}$", re.ASCII)
_POD_INDEX_RE = re.compile(r"-\d+$", re.ASCII)
_KUBEFLOW_REPLICA_RE = re.compile(
    r"-(?:master|worker|launcher|chief|ps|evaluator|server|scheduler|driver)-\d+$", re.ASCII
)


def pod_job_label(namespace: str, pod: str) -> str | None:
    """The job label ``k8s:<namespace>/<name>`` of a pod known only by its name (dcgm-exporter's ``pod`` and
    ``namespace`` labels), named as the Kubernetes provider names jobs: Kubeflow ``<job>-worker-3`` ->
    ``<job>``; Job ``<job>-x7k2p`` and Indexed Job ``<job>-3-x7k2p`` -> ``<job>`` (a JobSet's pod gives its
    child Job ``<jobset>-<replicated job>-<index>``; the provider lists that name as an alias of the JobSet).
    Best effort from the name alone; None without a pod."""
    if not pod:
        return None
    ns = namespace or "default"
    name = _KUBEFLOW_REPLICA_RE.sub("", pod)
    if name == pod:
        name = _POD_SUFFIX_RE.sub("", pod)
        if name != pod:
            name = _POD_INDEX_RE.sub("", name) or name
    return f"k8s:{ns}/{name or pod}"
