"""What the NVML backend keeps per GPU: its handle, the fields the probe found and how to read them, the
previous counters that rates are taken against, and the cached values and due times of the fields read less
often than every round."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from watchd.gpu.model import GpuIdentity

__all__ = ["NvmlDevice"]


@dataclass(slots=True)
class NvmlDevice:
    identity: GpuIdentity
    handle: Any
    probed: bool = False
    supported: set[str] = field(default_factory=set)
    nvlink_links: int = 0
    nvlink_counters: tuple[int, ...] = ()
    field_ids: tuple[int, ...] = ()  # read every round in one nvmlDeviceGetFieldValues call
    recovery_field: int | None = None  # field 230, read on the slow cadence
    nvlink_prev: tuple[float, int, int] | None = None  # (time, tx KiB, rx KiB) of the previous sample
    position: int = 0  # among the GPUs opened: staggers the slow and energy reads over the rounds
    pcie_counters: bool = False  # fields 197/198 supported: PCIe rates from byte counters
    pcie_prev: tuple[float, int, int] | None = None  # (time, tx bytes, rx bytes) of the previous sample
    cache: dict[str, dict[str, Any]] = field(default_factory=dict)  # last values of non-round fields
    due: dict[str, float] = field(default_factory=dict)  # next read of slow/energy fields
    energy_anchor: float | None = None  # J: the last energy counter read
    energy_integral: float = 0.0  # J: the power integral since that read
    energy_out: float | None = None  # J: the last value reported (never decreases)
    power_prev: tuple[float, float] | None = None  # (time, W) of the previous power reading
