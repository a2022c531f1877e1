"""One table of what GPU signals mean: the ``gpu_health`` conditions and the Xid resolution buckets, each
with its class for the detectors and what the shipped rule pack does with it.

Read by the health deriver (:mod:`watchd.gpu.health`: the conditions, their order, flag and clock-event
derivations), the Xid catalog (:mod:`watchd.xid.catalog`: the buckets and their default advice), the
detectors (:mod:`watchd.detect.fleet`: which signals are hardware evidence) and the rule pack's docs
(``docs/rules.md`` holds :func:`conditions_markdown` and :func:`buckets_markdown` verbatim; tests tie the
shipped rules in ``watchd/data/rules`` to the ``drains`` column and the named sets below).

Classes (:class:`Evidence`): ``hardware`` (a fault of the GPU: names a hang's culprit, attributes a
straggler to hardware), ``application`` (Xids an application triggers: evidence of which rank is the odd
one out, not of a fault), ``slowdown`` (clock-event reasons: attribute a straggler to hardware, never name a
hang's culprit) and ``none`` (not evidence either way).

To add a GPU condition: the :class:`~watchd.gpu.model.GpuSample` field, the backends that read it, and one
row here (a ``flag`` row needs nothing else: the deriver reports it while the field is true), then paste
``python -m watchd.xid.tables`` into docs/rules.md. A row whose ``response`` is not :data:`NO_RULE`
promises a rule in the shipped pack (gpu-health.yaml) that acts on it; the tests hold both to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from watchd.gpu.model import CLOCK_HW_POWER_BRAKE, CLOCK_HW_SLOWDOWN, CLOCK_HW_THERMAL, CLOCK_SW_THERMAL

__all__ = [
    "APPLICATION_XID_BUCKETS",
    "ATTENTION_XID_BUCKETS",
    "CONDITIONS",
    "FATAL_XID_BUCKETS",
    "GPU_CONDITIONS",
    "HARDWARE_CONDITIONS",
    "HARDWARE_XID_BUCKETS",
    "LEGACY_APPLICATION_XIDS",
    "NO_RULE",
    "REPEATED_APPLICATION_XIDS",
    "SLOWDOWN_CONDITIONS",
    "XID_BUCKETS",
    "Evidence",
    "GpuCondition",
    "XidBucket",
]


#: ``response`` of a condition no shipped rule acts on (evidence for the detectors, or recorded only).
NO_RULE = "none (no shipped rule)"


class Evidence(StrEnum):
    """What a signal tells the detectors."""

    HARDWARE = "hardware"
    APPLICATION = "application"
    SLOWDOWN = "slowdown"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class GpuCondition:
    """One ``gpu_health`` condition."""

    name: str
    evidence: Evidence  # for the detectors
    drains: bool  # the shipped pack (gpu-health.yaml) drains on it (for some values: recovery_action)
    value: str  # docs: what the event's ``value`` is
    response: str  # docs: what the shipped rules do
    #: a boolean GpuSample field: the condition holds while it is true (value 1); None: derived in code
    flag: str | None = None
    set_evidence: str = ""  # evidence of a flag condition while set ...
    clear_evidence: str = ""  # ... and when it clears
    #: a GpuSample field whose value, when known, is appended to the set evidence: (field, format)
    detail: tuple[str, str] | None = None
    #: clock-event reason conditions: the bits (any of them) and their names for the evidence line
    clock_reasons: tuple[tuple[int, str], ...] = ()


#: In the order the deriver reports them for one sample.
GPU_CONDITIONS: tuple[GpuCondition, ...] = (
    GpuCondition(
        "gpu_lost",
        Evidence.HARDWARE,
        drains=True,
        value="1 (NVML said GPU is lost)",
        response="drain + requeue + page",
    ),
    GpuCondition(
        "ecc_dbe",
        Evidence.HARDWARE,
        drains=True,
        value="uncorrectable (volatile) ECC errors",
        response="drain + requeue + page",
    ),
    GpuCondition(
        "row_remap_failure",
        Evidence.HARDWARE,
        drains=True,
        value="1 when NVML's remapped-rows failure flag is set",
        response="drain + requeue + page",
        flag="remap_failure",
        set_evidence="row remapping failure flag set",
        clear_evidence="row remapping failure flag clear",
        detail=("remapped_rows_uncorrectable", " ({} rows remapped for uncorrectable errors)"),
    ),
    GpuCondition(
        "row_remap_pending",
        Evidence.HARDWARE,
        drains=True,
        value="1 when a remap is pending",
        response="drain + page",
        flag="remap_pending",
        set_evidence="remapped rows pending, reset needed",
        clear_evidence="no remapped rows pending",
    ),
    GpuCondition(
        # Drained by the pack like row_remap_pending, but not hardware evidence for the detectors (as before
        # the table): a pending retirement says the memory was already fixed, not that the GPU misbehaves.
        "retired_pages_pending",
        Evidence.NONE,
        drains=True,
        value="1 when a page retirement is pending",
        response="drain + page",
        flag="retired_pages_pending",
        set_evidence="retired pages pending, reset needed",
        clear_evidence="no retired pages pending",
    ),
    GpuCondition(
        "recovery_action",
        Evidence.HARDWARE,
        drains=True,
        value="NVML field 230: 0 NONE … 7 SYSTEM_REBOOT; `evidence` carries the name",
        response="1,2,3,4,6,7: drain + requeue + page; 5: page",
    ),
    GpuCondition(
        "pcie_downtrain",
        Evidence.HARDWARE,
        drains=True,
        value="current link width (or generation) below the maximum",
        response="drain + page",
    ),
    GpuCondition(
        "pcie_replay_burst",
        Evidence.NONE,
        drains=False,
        value="PCIe replays in the interval",
        response="page (1/h)",
    ),
    GpuCondition(
        "nvlink_down",
        Evidence.HARDWARE,
        drains=True,
        value="NVLinks down",
        response="drain + page",
    ),
    GpuCondition(
        "nvlink_errors",
        Evidence.NONE,
        drains=False,
        value="NVLink errors (CRC, replay, recovery) in the interval",
        response="page (1/h)",
    ),
    GpuCondition(
        "hw_slowdown",
        Evidence.SLOWDOWN,
        drains=False,
        value="fraction of the interval HwSlowdown (0x8) was set, 0-1",
        response="page after 10 min",
        clock_reasons=((CLOCK_HW_SLOWDOWN, "HwSlowdown"),),
    ),
    GpuCondition(
        "thermal_slowdown",
        Evidence.SLOWDOWN,
        drains=False,
        value="fraction of the interval HwThermal (0x40) or SwThermal (0x20) was set, 0-1",
        response="page after 10 min",
        clock_reasons=((CLOCK_HW_THERMAL, "HwThermal"), (CLOCK_SW_THERMAL, "SwThermal")),
    ),
    GpuCondition(
        "power_brake",
        Evidence.SLOWDOWN,
        drains=False,
        value="fraction of the interval HwPowerBrake (0x80) was set, 0-1",
        response="page after 10 min",
        clock_reasons=((CLOCK_HW_POWER_BRAKE, "HwPowerBrake"),),
    ),
    GpuCondition(
        # Not a fault: the NCCL hang signature seen between two windows, so the hang detector learns of a
        # spin seconds after it starts (docs/detectors.md). Which GPU is the culprit it never says.
        "nccl_spin",
        Evidence.NONE,
        drains=False,
        value="power as a share of the GPU's computing baseline while util >= 90% and links idle "
        "(`since`: the first spinning sample)",
        response=NO_RULE,
    ),
)
CONDITIONS: tuple[str, ...] = tuple(c.name for c in GPU_CONDITIONS)
BY_NAME: dict[str, GpuCondition] = {c.name: c for c in GPU_CONDITIONS}
#: Conditions that are hardware faults for the detectors (a hang's culprit).
HARDWARE_CONDITIONS = frozenset(c.name for c in GPU_CONDITIONS if c.evidence is Evidence.HARDWARE)
#: Clock-event conditions: hardware attribution for stragglers, not culprits of a hang.
SLOWDOWN_CONDITIONS = frozenset(c.name for c in GPU_CONDITIONS if c.evidence is Evidence.SLOWDOWN)


@dataclass(frozen=True, slots=True)
class XidBucket:
    """One resolution bucket of NVIDIA's Xid catalog ("Resolution Bucket (Immediate Action)")."""

    name: str
    evidence: Evidence  # for the detectors
    drains: bool  # the shipped pack drains and requeues on any Xid of the bucket at once (xid-fatal-hardware)
    response: str  # docs: what the shipped rules do
    action: str  # the catalog's default advice for its Xids (an entry may override it)


XID_BUCKETS: tuple[XidBucket, ...] = (
    XidBucket(
        "RESTART_APP",
        Evidence.APPLICATION,
        drains=False,
        response="log; the same Xid 3 times in 24 h on one GPU across 2 jobs: drain + page",
        action="restart the application; if it repeats on this GPU across different jobs, drain the node "
        "and run diagnostics",
    ),
    XidBucket("IGNORE", Evidence.NONE, drains=False, response="log", action="none; informational"),
    XidBucket(
        "RESET_GPU",
        Evidence.HARDWARE,
        drains=True,
        response="drain + requeue + page",
        action="drain the node and reset the GPU (or reboot the node)",
    ),
    XidBucket(
        "RESTART_BM",
        Evidence.HARDWARE,
        drains=True,
        response="drain + requeue + page",
        action="drain node and reboot",
    ),
    XidBucket(
        "WORKFLOW_XID_45",
        Evidence.NONE,
        drains=False,
        response="page when no other Xid on the GPU in the 10 s before",
        action="none if it follows another Xid (act on that one); alone: restart the fabric manager",
    ),
    XidBucket(
        "WORKFLOW_XID_48",
        Evidence.HARDWARE,
        drains=True,
        response="drain + requeue + page",
        action="drain the node and reset the GPU; check ECC and row-remap counters, RMA if thresholds are "
        "exceeded",
    ),
    XidBucket(
        "WORKFLOW_NVLINK_ERR",
        Evidence.HARDWARE,
        drains=True,
        response="drain + requeue + page",
        action="drain the node and reset the GPU or reboot; check 'nvidia-smi nvlink -e', contact the vendor "
        "if it persists",
    ),
    XidBucket(
        "WORKFLOW_NVLINK5_ERR",
        Evidence.HARDWARE,
        drains=False,
        response="fatal: drain + requeue + page; non-fatal: log; undecoded: page",
        action="follow the NVLink5 workflow: act on the recovery action of the Xid 154 that follows (drain "
        "and reset the GPU when required)",
    ),
    XidBucket(
        "XID_154",
        Evidence.HARDWARE,
        drains=False,
        response="by recovery action: GPU_RESET, NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET, BUS_RESET, "
        "SYSTEM_REBOOT: drain + requeue + page; RECOVER_IMEX_DOMAIN, undecoded: page; NONE: log",
        action="perform the recovery action named in the message",
    ),
    XidBucket(
        "CHECK_MECHANICALS",
        Evidence.HARDWARE,
        drains=True,
        response="drain + requeue + page",
        action="drain the node and check the GPU's auxiliary power connection",
    ),
    XidBucket(
        "UPDATE_SWFW",
        Evidence.NONE,
        drains=False,
        response="page",
        action="check the vGPU software and firmware versions",
    ),
    XidBucket("RESTART_VM", Evidence.NONE, drains=False, response="page", action="restart the VM"),
    XidBucket(
        "CHECK_UVM",
        Evidence.NONE,
        drains=False,
        response="page",
        action="check the application's unified-memory use; reset the GPU if it repeats",
    ),
    XidBucket(
        # Pre-Ampere Xids, unused on current GPUs: hardware evidence for the detectors (as before the
        # table), a page but no drain in the pack.
        "CONTACT_SUPPORT",
        Evidence.HARDWARE,
        drains=False,
        response="page",
        action="collect nvidia-bug-report.sh and contact NVIDIA support",
    ),
    XidBucket(
        "UNKNOWN",
        Evidence.NONE,
        drains=False,
        response="page",
        action="consult the NVIDIA Xid catalog",
    ),
)
BUCKETS_BY_NAME: dict[str, XidBucket] = {b.name: b for b in XID_BUCKETS}
#: Xid buckets that implicate the GPU's hardware, for the detectors (not the application, not
#: informational). Wider than FATAL_XID_BUCKETS: NVLink5 and Xid 154 implicate the GPU whatever their
#: decoded severity or recovery action, and so do the pre-Ampere CONTACT_SUPPORT Xids.
HARDWARE_XID_BUCKETS = frozenset(b.name for b in XID_BUCKETS if b.evidence is Evidence.HARDWARE)
#: Xid buckets the shipped pack drains and requeues on at once (rule xid-fatal-hardware).
FATAL_XID_BUCKETS = frozenset(b.name for b in XID_BUCKETS if b.drains)
#: Xid buckets an application triggers (rule xid-application; repeated: app-xid-repeated).
APPLICATION_XID_BUCKETS = frozenset(b.name for b in XID_BUCKETS if b.evidence is Evidence.APPLICATION)
#: Xid buckets that need a person but no drain (rule xid-needs-attention).
ATTENTION_XID_BUCKETS = frozenset(b.name for b in XID_BUCKETS if b.response == "page")
#: Application Xids of an event without a bucket (an older agent, a source that knows only the number):
#: NVIDIA's older RESTART_APP list, which still has 43 (IGNORE in today's catalog). Rule xid-application.
LEGACY_APPLICATION_XIDS: tuple[int, ...] = (13, 31, 32, 43, 68, 69, 94)
#: The application Xids rule app-xid-repeated counts whatever their bucket (43 included).
REPEATED_APPLICATION_XIDS: tuple[int, ...] = (13, 31, 43)
