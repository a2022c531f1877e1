"""What one reading of one GPU holds. Shared by every backend (NVML, fake, dcgm-exporter), the health
deriver, the window summaries and the agent's metrics. ``None`` always means "not supported or not
available on this GPU", never zero."""

from __future__ import annotations

from dataclasses import dataclass, field

# Clock-event (throttle) reason bits, as NVML reports them (nvmlClocksEventReasons*).
CLOCK_GPU_IDLE = 0x1
CLOCK_APPLICATIONS_SETTING = 0x2
CLOCK_SW_POWER_CAP = 0x4
CLOCK_HW_SLOWDOWN = 0x8
CLOCK_SYNC_BOOST = 0x10
CLOCK_SW_THERMAL = 0x20
CLOCK_HW_THERMAL = 0x40
CLOCK_HW_POWER_BRAKE = 0x80
CLOCK_DISPLAY_CLOCK = 0x100

#: NVML field 230 (GPU recovery action) values.
RECOVERY_NONE = 0


class BackendUnavailable(Exception):
    """No GPU library or driver on this machine (NVML LibraryNotFound / DriverNotLoaded): the agent logs one
    line, reports ``watchd_source_up{source="nvml"} 0`` and keeps serving its other sources."""


class GpuLostError(Exception):
    """The GPU stopped answering (NVML GpuIsLost): itself a health event."""


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int
    uuid: str
    pci_bus_id: str  # normalized dddd:bb:dd.f, lower case (watchd.xid.pci.normalize_pci)
    model: str = ""
    serial: str = ""
    mig_mode: bool = False


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU at ``time`` (seconds since the epoch)."""

    time: float
    gpu: GpuIdentity
    lost: bool = False  # the GPU raised GpuIsLost: every other field is None
    util_gpu: float | None = None  # percent
    util_mem: float | None = None  # percent
    util_enc: float | None = None  # percent: video encoder (dcgm-exporter DCGM_FI_DEV_ENC_UTIL)
    util_dec: float | None = None  # percent: video decoder (DCGM_FI_DEV_DEC_UTIL)
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None  # total energy since driver load
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    clock_event_reasons: int | None = None  # bitmask of CLOCK_* above
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages_pending: bool | None = None
    pcie_replay_count: int | None = None
    pcie_link_gen: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    nvlink_up: tuple[bool, ...] | None = None  # per link
    nvlink_errors: int | None = None  # CRC + replay + recovery errors, summed over links
    nvlink_tx_bytes_per_s: float | None = None
    nvlink_rx_bytes_per_s: float | None = None
    recovery_action: int | None = None  # NVML field 230
    pids: tuple[int, ...] = field(default_factory=tuple)  # compute processes on this GPU
    job: str | None = None  # the job the backend itself names (dcgm-exporter pod labels), else from pids
