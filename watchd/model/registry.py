"""The registry of event kinds: every kind watchd builds, its class, and the fields rules may name on it.

Whatever lists kind names (ingest metrics labels, the template field check, the detectors' dispatch) reads
this table; a kind's fields are its class's (:meth:`~watchd.model.kinds.Attrs.fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from watchd.model import (
    action,
    check,
    finding,
    gpu,
    heartbeat,
    ib,
    reboot,
    reliability,
    trainlog,
    unavailable,
    xid,
)
from watchd.model.kinds import Attrs

__all__ = [
    "ALL_KINDS",
    "ENGINE_FIELDS",
    "EXTERNAL_KINDS",
    "FINDING_KINDS",
    "KINDS",
    "REPAIRED_KIND",
    "fields_of",
]

FINDING_KINDS: tuple[str, ...] = finding.KINDS

#: kind -> its class.
KINDS: Mapping[str, type[Attrs]] = MappingProxyType(
    {
        xid.KIND: xid.Xid,
        gpu.HEALTH_KIND: gpu.GpuHealth,
        gpu.SUMMARY_KIND: gpu.GpuSummary,
        heartbeat.KIND: heartbeat.Heartbeat,
        action.KIND: action.ActionFeedback,
        unavailable.KIND: unavailable.NodeUnavailable,  # drains by others
        **finding.CLASSES,
        check.KIND: check.CheckResult,  # active checks
        reliability.KIND: reliability.CheckpointInterval,  # checkpoint advice
        reboot.REBOOTED_KIND: reboot.NodeRebooted,  # a reboot watchd asked for is over
        reboot.OVERDUE_KIND: reboot.NodeRebootOverdue,
        ib.KIND: ib.IbPortHealth,  # InfiniBand/RoCE ports, from the agent's sysfs reader
        reboot.GPU_RESET_KIND: reboot.NodeGpuReset,  # the node's agent reset its GPUs as watchd asked
        # what the training stack says (PyTorch watchdog, NCCL, Flight Recorder)
        **{cls.KIND: cls for cls in trainlog.KINDS},
    }
)
#: Kinds watchd accepts but does not build itself (no attributes of their own): a repair system's
#: ``node_repaired``.
REPAIRED_KIND = "node_repaired"
EXTERNAL_KINDS: tuple[str, ...] = (REPAIRED_KIND,)
ALL_KINDS = frozenset(KINDS) | frozenset(EXTERNAL_KINDS)
#: Fields the engine adds at ingest: ``job`` to an ``xid`` or ``gpu_health`` event that names a GPU, from
#: the agents' summaries of that GPU.
ENGINE_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {xid.KIND: ("job",), gpu.HEALTH_KIND: ("job",)}
)


def fields_of(kind: str) -> frozenset[str]:
    """The attributes an event of ``kind`` may carry (its class's, and what the engine adds)."""
    cls = KINDS.get(kind)
    own = cls.fields() if cls is not None else ()
    return frozenset(own) | frozenset(ENGINE_FIELDS.get(kind, ()))
