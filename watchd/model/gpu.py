"""The GPU telemetry kinds: ``gpu_health`` (a condition of one GPU starts, holds or clears) and
``gpu_summary`` (one GPU's window of samples). The conditions themselves: :mod:`watchd.model.conditions`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from watchd.model.events import Scalar
from watchd.model.kinds import Attrs

__all__ = ["GPU_IDENTITY_FIELDS", "HEALTH_KIND", "SUMMARY_KIND", "GpuHealth", "GpuSummary"]

HEALTH_KIND = "gpu_health"
SUMMARY_KIND = "gpu_summary"
#: How every GPU kind names its GPU: index on the node, UUID, normalized PCI bus id (and, in summaries,
#: the model).
GPU_IDENTITY_FIELDS = ("gpu", "uuid", "pci_bus_id", "model")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuHealth(Attrs):
    """One report of one condition of one GPU: when it starts, again every report interval while it holds
    (sooner when a discrete value changes), and with ``value`` 0 when it clears."""

    KIND: ClassVar[str] = HEALTH_KIND

    condition: str  # a row of watchd.model.conditions.GPU_CONDITIONS
    gpu: int | None = None  # always sent by the agents; optional for readers (only condition and value are)
    uuid: str | None = None
    pci_bus_id: str | None = None
    value: int | float  # the measurement; 0: cleared
    threshold: int | float | None = None  # the limit value crossed, when there is one
    evidence: str | None = None  # one readable line
    extra: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSummary(Attrs):
    """One GPU's window of samples (``time`` of the event: the window's end). A statistic whose readings
    were all missing (unsupported) is None, left out on the wire."""

    KIND: ClassVar[str] = SUMMARY_KIND

    gpu: int
    uuid: str | None = None  # always sent by the agents; optional for readers (only gpu is)
    pci_bus_id: str | None = None
    model: str | None = None
    job: str | None = None  # slurm:<id> | k8s:<uid>: the job most of the window's samples ran
    window_s: float | None = None
    window_start: float | None = None
    samples: int | None = None
    util_mean: float | None = None  # percent
    util_min: float | None = None
    util_max: float | None = None
    power_mean: float | None = None  # W
    power_min: float | None = None
    power_max: float | None = None
    sm_clock_mean: float | None = None  # MHz
    sm_clock_min: float | None = None
    sm_clock_max: float | None = None
    sm_clock_max_rated: float | None = None
    clock_reasons: int | None = None  # OR of the window's clock-event reason bits
    hw_slowdown_frac: float | None = None  # fractions of the samples reporting reasons
    thermal_frac: float | None = None  # HwThermal or SwThermal
    power_brake_frac: float | None = None
    nvlink_tx_mean: float | None = None  # bytes/s
    nvlink_rx_mean: float | None = None
    pcie_tx_mean: float | None = None
    pcie_rx_mean: float | None = None
    temp_mean: float | None = None  # degrees C
    extra: Mapping[str, Scalar] = field(default_factory=dict)
