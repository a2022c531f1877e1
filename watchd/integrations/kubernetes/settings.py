"""The ``kubernetes:`` section of the engine config: the API connection, the taint, evictions and the Lease
election of engine replicas. Pydantic and watchd's vocabulary only: lightkube is not imported to load it."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from watchd.integrations.settings import SchedulerSettings
from watchd.model.durations import Seconds
from watchd.strict import Strict


class EvictionConfig(Strict):
    deadline_s: Seconds = 300.0  # a PodDisruptionBudget's 429 is retried with backoff up to this
    backoff_initial_s: Seconds = 1.0
    backoff_max_s: Seconds = 10.0
    gpu_only: bool = False  # evict only the pods that request gpu_resource
    gpu_resource: str = "nvidia.com/gpu"
    delete_after_deadline: bool = False  # delete what a budget still holds at the deadline


class LeaderElectionConfig(Strict):
    """Several engine replicas: only the holder of a coordination.k8s.io Lease acts."""

    enabled: bool = False
    namespace: str = "watchd"
    lease_name: str = "watchd-engine"
    identity: str = Field(default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname())
    lease_duration_s: Seconds = 15.0
    renew_deadline_s: Seconds = 10.0
    retry_period_s: Seconds = 2.0

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionConfig:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("leader election needs retry_period_s < renew_deadline_s < lease_duration_s")
        return self


class KubernetesConfig(SchedulerSettings):
    kubeconfig: Path | None = None  # None: the pod's service account in a cluster, else $KUBECONFIG
    context: str | None = None
    in_cluster: bool | None = None  # None: detect (KUBERNETES_SERVICE_HOST set and no kubeconfig)
    timeout_s: Seconds = 10.0
    pool_label: str = "nvidia.com/gpu.product"  # the blast-radius breaker counts per value of this label
    node_selector: str | None = None  # label selector of the nodes watchd manages (pools)
    taint_key: str = Field(
        default="watchd.io/gpu-fault", pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9][-A-Za-z0-9_.]*$"
    )
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    eviction: EvictionConfig = EvictionConfig()
    requeue: Literal["delete", "annotate"] = "delete"
    max_concurrency: Annotated[int, Field(ge=1)] = 16
    leader_election: LeaderElectionConfig = LeaderElectionConfig()
