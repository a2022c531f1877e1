"""The kinds of a remediation watchd asked for: ``node_rebooted`` when the node came back from its reboot
(a new boot, no reboot pending: validation starts by itself), ``node_reboot_overdue`` when it has not come
back in ``remediation.return_timeout_s`` (the shipped rules page), ``node_gpu_reset`` when the node's agent
reset its GPUs (validation starts by itself too)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from watchd.model.events import Scalar
from watchd.model.kinds import Attrs

__all__ = [
    "GPU_RESET_KIND",
    "OVERDUE_KIND",
    "REBOOTED_KIND",
    "SOURCE",
    "NodeGpuReset",
    "NodeRebootOverdue",
    "NodeRebooted",
]

REBOOTED_KIND = "node_rebooted"
OVERDUE_KIND = "node_reboot_overdue"
GPU_RESET_KIND = "node_gpu_reset"
SOURCE = "watchd:reboots"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRebooted(Attrs):
    KIND: ClassVar[str] = REBOOTED_KIND

    requested_at: float  # when watchd asked for the reboot (epoch seconds)
    after_s: float  # from the request to the node seen back
    boot_id: str  # the new boot (Slurm: its BootTime; Kubernetes: its bootID)
    extra: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRebootOverdue(Attrs):
    KIND: ClassVar[str] = OVERDUE_KIND

    requested_at: float
    after_s: float  # how long it has been
    state: str  # the node's state as the scheduler shows it now
    extra: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeGpuReset(Attrs):
    KIND: ClassVar[str] = GPU_RESET_KIND

    requested_at: float  # when watchd asked for the reset (epoch seconds)
    after_s: float  # from the request to the agent's report
    gpus: str  # the PCI bus ids of the GPUs reset, comma-separated
    command: str  # the command's id (the agent's logs and metrics name it)
    extra: Mapping[str, Scalar] = field(default_factory=dict)
