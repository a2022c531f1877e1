"""The NVIDIA Xid catalog: what an Xid means, its resolution bucket and what an SRE should do about it.

Buckets are NVIDIA's "Resolution Bucket (Immediate Action)" from the Xid catalog for Ampere and newer GPUs
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): ``RESTART_APP``, ``IGNORE``,
``RESET_GPU``, ``RESTART_BM`` (restart bare metal: reboot the node), ``WORKFLOW_XID_45``,
``WORKFLOW_XID_48``, ``WORKFLOW_NVLINK_ERR``, ``WORKFLOW_NVLINK5_ERR``, ``XID_154``, ``CHECK_MECHANICALS``,
``UPDATE_SWFW``, ``RESTART_VM``, ``CHECK_UVM`` and ``CONTACT_SUPPORT`` (used by the catalog for Xids that
are unused on current GPUs). Every number from 1 to 173 is described (where each range comes from is said
at its table); an Xid this module does not know gets the bucket ``UNKNOWN``. The buckets, their
class (hardware, application) and default advice are rows of :data:`watchd.model.conditions.XID_BUCKETS`.

Application Xids (``RESTART_APP``: 13, 31, 43, ...) are not hardware faults on their own; repeated on one GPU
across different jobs they are. That judgement belongs to the rules, not to this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from watchd.model.conditions import XID_BUCKETS

__all__ = ["BUCKETS", "RECOVERY_ACTIONS", "XidInfo", "known_xids", "lookup"]


@dataclass(frozen=True, slots=True)
class XidInfo:
    """One catalog entry: ``meaning`` is a short description, ``action`` what an operator should do."""

    xid: int
    meaning: str
    bucket: str
    action: str


#: Xid 154 "GPU recovery action changed ... to 0x<n> (...)": the code and its name.
RECOVERY_ACTIONS: Final[dict[int, str]] = {
    0: "NONE",
    1: "GPU_RESET",
    2: "NODE_REBOOT",
    3: "DRAIN_P2P",
    4: "DRAIN_AND_RESET",
    5: "RECOVER_IMEX_DOMAIN",
    6: "BUS_RESET",
    7: "SYSTEM_REBOOT",
}

# Default recommended action per bucket (watchd.model.conditions, the one table of buckets); entries below
# override it where the Xid needs something specific.
_ACTIONS: Final[dict[str, str]] = {b.name: b.action for b in XID_BUCKETS}

BUCKETS: Final[frozenset[str]] = frozenset(_ACTIONS)

# xid: (meaning, bucket[, action override])
_ENTRIES: Final[dict[int, tuple[str, str] | tuple[str, str, str]]] = {
    8: ("GPU stopped processing (channel idle timeout)", "RESTART_APP"),
    11: ("invalid or corrupted push buffer stream", "RESTART_APP"),
    13: (
        "graphics engine exception",
        "RESTART_APP",
        "restart the application; debug it with compute-sanitizer if it repeats; a hardware suspect only "
        "if it repeats on this GPU across different jobs",
    ),
    14: ("fake or injected error", "IGNORE"),
    25: ("invalid or illegal push buffer stream", "RESTART_APP"),
    31: (
        "GPU memory page fault",
        "RESTART_APP",
        "restart the application; debug it with compute-sanitizer if it repeats; a hardware suspect only "
        "if it repeats on this GPU across different jobs",
    ),
    32: (
        "invalid or corrupted push buffer stream (PBDMA error, often PCIe quality)",
        "RESTART_APP",
        "restart the application; check the PCIe link (replay counters, AER) if it repeats",
    ),
    37: ("driver firmware error", "IGNORE"),
    38: ("driver firmware error (FECS watchdog timeout)", "IGNORE"),
    39: ("copy engine exception", "RESTART_APP"),
    40: ("copy engine exception", "RESTART_APP"),
    41: ("copy engine exception", "RESTART_APP"),
    43: (
        "GPU stopped processing (application fault; the GPU remains healthy)",
        "IGNORE",
        "none for the GPU; the application hit a fault and was stopped, restart it",
    ),
    44: ("graphics engine fault during context switch", "IGNORE"),
    45: ("preemptive cleanup, due to previous errors", "WORKFLOW_XID_45"),
    46: ("GPU stopped processing (GPU timeout)", "RESET_GPU"),
    48: ("double-bit ECC error", "WORKFLOW_XID_48"),
    54: ("auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS"),
    56: ("display engine error (pre-Ampere)", "CONTACT_SUPPORT"),
    57: ("error programming video memory interface (pre-Ampere)", "CONTACT_SUPPORT"),
    58: ("unstable video memory interface detected (pre-Ampere)", "CONTACT_SUPPORT"),
    60: ("video processor exception (SEC2)", "RESTART_APP"),
    61: ("internal micro-controller breakpoint/warning (pre-Ampere)", "CONTACT_SUPPORT"),
    62: ("internal micro-controller halt", "RESET_GPU"),
    63: (
        "row remapping / page retirement event (ECC memory error handled)",
        "IGNORE",
        "none; informational (a pending remap is applied at the next GPU reset)",
    ),
    64: ("row remapping / page retirement failure", "RESET_GPU"),
    65: ("video processor exception (pre-Ampere)", "CONTACT_SUPPORT"),
    66: ("illegal access by driver", "IGNORE"),
    67: ("illegal access by driver", "IGNORE"),
    68: ("NVDEC0 (video decoder) exception", "RESTART_APP"),
    69: ("graphics engine class error", "RESTART_APP"),
    70: ("copy engine 3 error", "RESTART_APP"),
    71: ("copy engine 4 error", "RESTART_APP"),
    72: ("copy engine 5 error", "RESTART_APP"),
    74: ("NVLink error", "WORKFLOW_NVLINK_ERR"),
    75: ("copy engine 6 error", "RESTART_APP"),
    76: ("copy engine 7 error", "RESTART_APP"),
    77: ("copy engine 8 error", "RESTART_APP"),
    78: ("vGPU start error", "UPDATE_SWFW"),
    79: (
        "GPU has fallen off the bus",
        "RESTART_BM",
        "drain node and reboot; check PCIe/SEL logs, RMA if it recurs",
    ),
    80: ("corrupted data sent to GPU (push buffer CRC mismatch)", "RESTART_APP"),
    82: ("NVJPG0 (JPEG decoder) error", "RESTART_APP"),
    83: ("NVDEC1 (video decoder) error", "RESTART_APP"),
    84: ("NVDEC2 (video decoder) error", "RESTART_APP"),
    85: ("copy engine 9 error", "RESTART_APP"),
    86: ("OFA (optical flow accelerator) exception", "RESTART_APP"),
    88: ("NVDEC3 (video decoder) error", "RESTART_APP"),
    89: ("NVDEC4 (video decoder) error", "RESTART_APP"),
    92: ("high single-bit ECC error rate", "IGNORE", "none; informational (watch the ECC error rate)"),
    93: ("non-fatal violation of provisioned InfoROM wear limit", "IGNORE"),
    94: (
        "contained ECC error",
        "RESTART_APP",
        "restart the affected application; reset the GPU when convenient",
    ),
    95: ("uncontained ECC error", "RESET_GPU", "drain the node and reset the GPU before restarting jobs"),
    96: ("NVDEC5 (video decoder) error", "RESTART_APP"),
    97: ("NVDEC6 (video decoder) error", "RESTART_APP"),
    98: ("NVDEC7 (video decoder) error", "RESTART_APP"),
    99: ("NVJPG1 (JPEG decoder) error", "RESTART_APP"),
    100: ("NVJPG2 (JPEG decoder) error", "RESTART_APP"),
    101: ("NVJPG3 (JPEG decoder) error", "RESTART_APP"),
    102: ("NVJPG4 (JPEG decoder) error", "RESTART_APP"),
    103: ("NVJPG5 (JPEG decoder) error", "RESTART_APP"),
    104: ("NVJPG6 (JPEG decoder) error", "RESTART_APP"),
    105: ("NVJPG7 (JPEG decoder) error", "RESTART_APP"),
    106: ("SMBPBI test message", "IGNORE"),
    107: ("SMBPBI test message (silent)", "IGNORE"),
    108: ("NVLink remote translation error", "IGNORE"),
    109: ("context switch timeout", "RESET_GPU"),
    110: (
        "security fault",
        "RESET_GPU",
        "drain node and reboot (cold reset); contact the vendor if it persists",
    ),
    119: (
        "GSP RPC timeout",
        "RESET_GPU",
        "drain the node and reset the GPU; power-cycle the node if it persists",
    ),
    120: (
        "GSP error",
        "RESET_GPU",
        "drain the node and reset the GPU; power-cycle the node if it persists",
    ),
    121: (
        "C2C link corrected error",
        "IGNORE",
        "none; reset the GPU at the next maintenance window to retrain the C2C link",
    ),
    126: ("copy engine 10 error", "RESTART_APP"),
    127: ("copy engine 11 error", "RESTART_APP"),
    128: ("copy engine 12 error", "RESTART_APP"),
    129: ("copy engine 13 error", "RESTART_APP"),
    130: ("copy engine 14 error", "RESTART_APP"),
    131: ("copy engine 15 error", "RESTART_APP"),
    132: ("copy engine 16 error", "RESTART_APP"),
    133: ("copy engine 17 error", "RESTART_APP"),
    134: ("copy engine 18 error", "RESTART_APP"),
    135: ("copy engine 19 error", "RESTART_APP"),
    136: (
        "NVLink link training failed",
        "RESET_GPU",
        "drain the node and reset the GPU; investigate NVLink signal integrity if it recurs",
    ),
    137: ("NVLink privilege error (illegal peer-to-peer access)", "IGNORE"),
    139: ("OFA1 (optical flow accelerator) error", "RESTART_APP"),
    140: (
        "unrecovered ECC error",
        "RESET_GPU",
        "drain the node and reset the GPU; contact the vendor if it persists",
    ),
    141: ("CUDA fast path error", "IGNORE"),
    142: ("NVENC3 (video encoder) error", "CONTACT_SUPPORT"),
    143: (
        "GPU initialization failure",
        "RESET_GPU",
        "reset the GPU (or reboot the node); contact support if it persists",
    ),
    144: ("NVLink5 SAW error", "WORKFLOW_NVLINK5_ERR"),
    145: ("NVLink5 RLW error", "WORKFLOW_NVLINK5_ERR"),
    146: ("NVLink5 TLW error", "WORKFLOW_NVLINK5_ERR"),
    147: ("NVLink5 TREX error", "WORKFLOW_NVLINK5_ERR"),
    148: ("NVLink5 NVLPW control error", "WORKFLOW_NVLINK5_ERR"),
    149: ("NVLink5 NETIR error", "WORKFLOW_NVLINK5_ERR"),
    150: ("NVLink5 MSE error", "WORKFLOW_NVLINK5_ERR"),
    151: ("key rotation error", "RESTART_VM"),
    152: ("DLA SMMU error", "IGNORE"),
    153: ("DLA timeout error", "IGNORE"),
    154: ("GPU recovery action changed", "XID_154"),
    155: ("NVLink software-defined error (intentional link down)", "RESET_GPU"),
    156: ("resource retirement event", "RESET_GPU"),
    157: (
        "resource retirement failure (no spare resources)",
        "IGNORE",
        "none now; plan to replace the GPU if the Xid repeats",
    ),
    158: ("GPU fatal timeout", "RESET_GPU"),
    159: ("CHI non-data error (C2C)", "CHECK_UVM"),
    160: ("channel retirement event", "IGNORE"),
    161: ("channel retirement failure", "IGNORE"),
    # NVIDIA's catalog (analyzing-xid-catalog.html, the version that runs to 172) names 162-172 and gives
    # no resolution bucket for any of them: its bucket cells are empty or hold advice, quoted in the action
    # where there is some. The buckets below are watchd's choice, each from the nearest Xid the catalog
    # does bucket; docs/rules.md lists them. 173 is not in that version: its name is from the Go copy of the
    # catalog in github.com/leptonai/gpud (its Xid table), its bucket is watchd's choice like the others.
    162: ("power smoothing circuitry capability re-engaged", "IGNORE"),
    163: (
        "power smoothing circuitry capability disengaged",
        "IGNORE",
        "no GPU reset required; for power smoothing, resolve the thermal events; if it was disabled by a "
        "timeout, reload the driver or reset the GPU",
    ),
    164: (
        "power smoothing circuitry low lifetime reached",
        "IGNORE",
        "watch power swings; power smoothing will be disabled soon: plan to replace the GPU if it is needed",
    ),
    165: (
        "power smoothing circuitry lifetime exhausted",
        "IGNORE",
        "power smoothing is disabled and power swings will occur: replace the GPU if they are not acceptable",
    ),
    166: (
        "confidential-computing NVLink traffic before the link was configured for encryption",
        "CONTACT_SUPPORT",
        "confidential-computing mode only: collect nvidia-bug-report.sh and contact NVIDIA support",
    ),
    167: (
        "PCIe fatal timeout",
        "RESTART_BM",
        "drain node and reboot; check PCIe AER and SEL logs, RMA if it recurs",
    ),
    168: (
        "reduced GPU memory capacity: errors in the write-protected region (WPR)",
        "RESTART_BM",
        "drain node and reboot to retry the boot with a shifted WPR; seen with ECC disabled: enable ECC so "
        "rows can be remapped",
    ),
    169: ("internal micro-controller halt (SEC2)", "RESET_GPU"),
    170: (
        "interrupt in confidential-computing mode",
        "CONTACT_SUPPORT",
        "confidential-computing mode only: collect nvidia-bug-report.sh and contact NVIDIA support",
    ),
    171: (
        "uncorrectable DRAM error (detail of an Xid 48)",
        "WORKFLOW_XID_48",
        "follow the Xid 48 it details: drain the node and reset the GPU; check row-remap counters",
    ),
    172: (
        "uncorrectable SRAM error (detail of an Xid 48)",
        "WORKFLOW_XID_48",
        "follow the Xid 48 it details: drain the node and reset the GPU; check the SRAM DBE threshold "
        "(nvidia-smi), run field diagnostics and RMA if it is exceeded",
    ),
    173: (
        "C2C fatal link failure",
        "RESTART_BM",
        "drain node and reboot; contact the vendor if the C2C link fails again",
    ),
}

# The catalog's "Unused" Xids (bucket CONTACT_SUPPORT: not raised on Ampere and newer GPUs), by mnemonic.
_UNUSED: Final[dict[int, str]] = {
    1: "FIFO method error",
    2: "FIFO software method error",
    3: "FIFO unknown method error",
    4: "FIFO channel busy",
    5: "FIFO runout overflow",
    6: "FIFO parse error",
    7: "FIFO PTE error",
    9: "graphics instance error",
    10: "graphics single-step error",
    12: "graphics software method error",
    15: "scanline timeout",
    16: "vblank callback timeout",
    17: "parameter error",
    18: "bus master timeout",
    19: "display missed notifier",
    20: "MPEG software method error",
    21: "motion estimation software method error",
    22: "video processor software method error",
    23: "RC logging enabled",
    24: "graphics semaphore timeout",
    26: "FIFO FBI state timeout",
    27: "video processor error",
    28: "video processor 2 error",
    29: "BSP error",
    30: "bad address access",
    33: "SEC error",
    34: "MSVLD error",
    35: "MSPDEC error",
    36: "MSPPP error",
    42: "VIC error",
    47: "NVENC0 error",
    49: "silent running: constant level set by registry",
    50: "silent running: level transition on RC error",
    51: "silent running: stress test failure",
    52: "silent running: level transition on temperature rise",
    53: "silent running: clocks reduced for temperature",
    55: "silent running: temperature read error",
    59: "PMU error",
    73: "NVENC2 error",
    81: "VGA subsystem error",
    87: "telemetry driver report",
    90: "LTC error",
    91: "reserved",
    111: "display bundle error",
    112: "display supervisor error",
    113: "DP link training failure",
    114: "display head underflow",
    115: "display core channel registers",
    116: "display window channel registers",
    117: "display cursor channel registers",
    118: "display head registers",
    122: "SPI PMU RPC read failure",
    123: "SPI PMU RPC write failure",
    124: "SPI PMU RPC erase failure",
    125: "InfoROM file system error",
    138: "DLA error",
}


def _build() -> dict[int, XidInfo]:
    table: dict[int, XidInfo] = {}
    for xid, name in _UNUSED.items():
        table[xid] = XidInfo(
            xid, f"unused on current GPUs ({name})", "CONTACT_SUPPORT", _ACTIONS["CONTACT_SUPPORT"]
        )
    for xid, entry in _ENTRIES.items():
        meaning, bucket = entry[0], entry[1]
        action = entry[2] if len(entry) == 3 else _ACTIONS[bucket]
        table[xid] = XidInfo(xid=xid, meaning=meaning, bucket=bucket, action=action)
    return table


_CATALOG: Final = MappingProxyType(_build())


def lookup(xid: int) -> XidInfo:
    """The catalog entry for ``xid``; an Xid not in the catalog gets bucket ``UNKNOWN``."""
    info = _CATALOG.get(xid)
    if info is not None:
        return info
    return XidInfo(xid=xid, meaning="unknown Xid", bucket="UNKNOWN", action=_ACTIONS["UNKNOWN"])


def known_xids() -> frozenset[int]:
    """Every Xid this catalog describes."""
    return frozenset(_CATALOG)
