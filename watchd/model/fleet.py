"""A node as its scheduler lists it (Slurm's ``sinfo -N``, a Kubernetes Node object), shared by the
schedulers' fleet backends and the classification of the nodes out of service (:mod:`watchd.fleetview`);
and what each scheduler says of its own accord (Slurm's reasons, Kubernetes' taints): the node's state, not
an admin's decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["KUBERNETES_OWN_TAINTS", "SLURM_OWN_REASONS", "FleetNode"]

#: Reasons Slurm sets itself (slurmctld / slurmd, 22.05), matched case-insensitively at the start of the
#: reason, and their reason class.
SLURM_OWN_REASONS: Mapping[str, str] = {
    "not responding": "not_responding",
    "kill task failed": "kill_task_failed",
    "node unexpectedly rebooted": "unexpected_reboot",
    "node silently failed and came back": "unexpected_reboot",
    "reboot asap": "reboot",
    "reboot requested": "reboot",
    "reboot issued": "reboot",
    "scheduled reboot": "reboot",
    "reboot timed out": "reboot",
    "prolog error": "prolog_epilog",
    "epilog error": "prolog_epilog",
    "batch job complete failure": "job_failure",
    "job credential revoked": "job_failure",
    "duplicate jobid": "job_failure",
    "low realmemory": "config_mismatch",
    "low tmpdisk": "config_mismatch",
    "low cpus": "config_mismatch",
    "low socket*core*thread count": "config_mismatch",
    "low socket*core count": "config_mismatch",
    "gres/": "config_mismatch",
    "invalid gres": "config_mismatch",
    "slurmdspooldir is full": "disk_full",
    "health check failed": "health_check",
    "node failure": "node_failure",
    "power_down": "power",
    "power down": "power",
    "powered down": "power",
}
#: Kubernetes taints (and node conditions) the control plane sets itself.
KUBERNETES_OWN_TAINTS: Mapping[str, str] = {
    "node.kubernetes.io/not-ready": "not_ready",
    "node.kubernetes.io/unreachable": "not_responding",
    "node.kubernetes.io/unschedulable": "cordoned",
    "node.kubernetes.io/memory-pressure": "pressure",
    "node.kubernetes.io/disk-pressure": "pressure",
    "node.kubernetes.io/pid-pressure": "pressure",
    "node.kubernetes.io/network-unavailable": "network",
    "node.kubernetes.io/out-of-service": "node_failure",
}


@dataclass(frozen=True, slots=True)
class FleetNode:
    """One node as its scheduler lists it.

    ``state`` is the base state in lower case (idle, allocated, mixed, down, fail, unknown ...); ``flags``
    upper case (DRAIN, NOT_RESPONDING, FAIL, CORDONED, RESERVED ...); ``since`` is when the reason was set
    (epoch seconds) when known. ``watchd_owned``: the scheduler knows watchd took it out (the Kubernetes
    drain annotation) even when the reason text does not say so. ``spare``: held idle by watchd as a hot
    spare (it is in service, only kept out of normal scheduling)."""

    name: str
    scheduler: str
    partitions: tuple[str, ...] = ()
    state: str = "idle"
    flags: frozenset[str] = frozenset()
    reason: str | None = None
    user: str | None = None
    since: float | None = None
    watchd_owned: bool = False
    spare: bool = False
    taints: tuple[str, ...] = ()  # Kubernetes: the keys of the node's NoSchedule/NoExecute taints

    @property
    def out_of_service(self) -> bool:
        """Drained, draining, down, failed or cordoned: the scheduler places no new work on it."""
        return (
            bool(self.flags & {"DRAIN", "FAIL", "CORDONED", "MAINT"})
            or self.state in ("down", "fail", "failing", "drained", "draining")
            or self.state.startswith("down")
        )

    @property
    def idle(self) -> bool:
        """Idle and untouched: no job, no flag but the spare reservation's, no reason."""
        return (
            self.state == "idle"
            and not (self.flags - {"RESERVED"})
            and not self.reason
            and not self.out_of_service
        )
