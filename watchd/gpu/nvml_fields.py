"""The NVML fields, one row each: the name the backend probes and samples it by, the ``pynvml`` functions
that read it, the ids it asks ``nvmlDeviceGetFieldValues`` for, and how often it is read. The real backend
(:mod:`watchd.gpu.nvml`: its ``FIELDS`` and ``CADENCE`` come from here), the cost-faithful stand-in
(:mod:`watchd.gpu.nvml_standin`) and the test fake (tests/gpu/test_gpu_nvml.py) are all held to this
table by tests/gpu/test_nvml_fields.py: a call or field id the backend reads and a stand-in lacks fails a
test. Pure data; nothing here imports ``pynvml``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ENERGY",
    "FI_NVLINK_RX_KIB",
    "FI_NVLINK_TX_KIB",
    "FI_PCIE_RX_BYTES",
    "FI_PCIE_TX_BYTES",
    "FI_RECOVERY_ACTION",
    "LIBRARY_CALLS",
    "NVML_FIELDS",
    "OLDER_NAMES",
    "ROUND",
    "SLOW",
    "STATIC",
    "NvmlField",
]

#: cadences: once at the probe; every ``slow_interval_s``; every ``energy_interval_s``; every round
STATIC, SLOW, ENERGY, ROUND = "static", "slow", "energy", "round"

FI_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
FI_NVLINK_TX_KIB = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: cumulative KiB (scope: all links)
FI_NVLINK_RX_KIB = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
FI_PCIE_TX_BYTES = 197  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES: cumulative bytes
FI_PCIE_RX_BYTES = 198  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES


@dataclass(frozen=True, slots=True)
class NvmlField:
    name: str  # as NvmlBackend.supported_fields() gives it
    calls: tuple[str, ...]  # every pynvml function reading it (fallbacks and MIG paths included)
    cadence: str = ROUND
    field_ids: tuple[int, ...] = ()  # asked of nvmlDeviceGetFieldValues


def _row(name: str, *calls: str, cadence: str = ROUND, field_ids: tuple[int, ...] = ()) -> NvmlField:
    return NvmlField(name, calls, cadence, field_ids)


#: The fields, in sampling order (docs/gpu-nvml-cost.md has each one's measured cost).
NVML_FIELDS: tuple[NvmlField, ...] = (
    _row("utilization", "nvmlDeviceGetUtilizationRates"),
    _row("memory", "nvmlDeviceGetMemoryInfo"),
    _row("temperature", "nvmlDeviceGetTemperature"),
    _row("power", "nvmlDeviceGetPowerUsage"),
    _row("power_limit", "nvmlDeviceGetEnforcedPowerLimit", cadence=SLOW),
    _row("energy", "nvmlDeviceGetTotalEnergyConsumption", cadence=ENERGY),
    _row("sm_clock", "nvmlDeviceGetClockInfo"),
    _row("sm_clock_max", "nvmlDeviceGetMaxClockInfo", cadence=STATIC),
    # the throttle-reasons call: bindings or drivers older than r535
    _row(
        "clock_event_reasons",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ),
    _row("ecc_volatile_corrected", "nvmlDeviceGetTotalEccErrors"),
    _row("ecc_volatile_uncorrected", "nvmlDeviceGetTotalEccErrors"),
    _row("ecc_aggregate_corrected", "nvmlDeviceGetTotalEccErrors", cadence=SLOW),
    _row("ecc_aggregate_uncorrected", "nvmlDeviceGetTotalEccErrors", cadence=SLOW),
    _row("remapped_rows", "nvmlDeviceGetRemappedRows"),
    _row("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", cadence=SLOW),
    _row("pcie_replay", "nvmlDeviceGetPcieReplayCounter", cadence=SLOW),
    _row("pcie_link_gen", "nvmlDeviceGetCurrPcieLinkGeneration", cadence=SLOW),
    _row("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", cadence=STATIC),
    _row("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", cadence=SLOW),
    _row("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth", cadence=STATIC),
    _row("nvlink_state", "nvmlDeviceGetNvLinkState", cadence=SLOW),
    _row("nvlink_errors", "nvmlDeviceGetNvLinkErrorCounter", cadence=SLOW),
    # read every round in one call: PCIe byte counters (rates between rounds), NVLink traffic
    _row(
        "field_values",
        "nvmlDeviceGetFieldValues",
        field_ids=(FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES, FI_NVLINK_TX_KIB, FI_NVLINK_RX_KIB),
    ),
    _row("recovery_action", "nvmlDeviceGetFieldValues", cadence=SLOW, field_ids=(FI_RECOVERY_ACTION,)),
    # only where the PCIe byte counters (197/198) are not supported: it samples 20 ms per direction
    _row("pcie_throughput", "nvmlDeviceGetPcieThroughput", cadence=SLOW),
    # a MIG parent: its processes from its MIG devices
    _row(
        "processes",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
    ),
)

#: The calls outside the fields: the library, identifying each GPU, Xid events and their GPU.
LIBRARY_CALLS: tuple[str, ...] = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetMigMode",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
)

#: Older names the backend falls back to where the bindings lack the newer one (not asked of a stand-in).
OLDER_NAMES: dict[str, str] = {"nvmlEventSetWait": "nvmlEventSetWait_v2"}
