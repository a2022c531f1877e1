"""GPU scenarios for the fake backend: a node's GPUs, their load, and faults at given times.

A scenario is YAML (validated strictly, errors name the file and the key path) or built in code::

    seed: 7
    gpus: {model: H100-SXM, count: 8}
    load: training
    faults:
      - {kind: ecc_dbe, at: 120, gpu: 3}
      - {kind: thermal, at: 60, gpu: [5], duration: 300}
      - {kind: nccl_hang, at: 600, gpu: all}

    Scenario.training(gpus=8, faults=[Straggler(at=30, gpu=2)])

``at`` and ``duration`` are seconds from the backend's ``start_time``; a fault without ``duration`` lasts
forever. ``gpu`` is an index, a list of indices, or ``all``. Counters a fault raises (ECC, remapped rows,
NVLink errors) stay raised after the fault ends, as on real hardware (volatile ECC counts reset when it ends:
the GPU was reset).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import Field, model_validator

from watchd.config import load_yaml, parse_config
from watchd.strict import Strict as _Strict

__all__ = [
    "FAULT_KINDS",
    "PRESETS",
    "EccDbe",
    "FallOffBus",
    "Fault",
    "GpuPreset",
    "GpuSpec",
    "HwSlowdown",
    "NcclHang",
    "NvlinkDown",
    "PcieDowntrain",
    "PowerBrake",
    "RowRemapFailure",
    "Scenario",
    "StalledRank",
    "Straggler",
    "Thermal",
    "XidFault",
    "load_scenario",
    "parse_scenario",
]


class GpuPreset(NamedTuple):
    nvml_name: str  # what nvmlDeviceGetName says
    tdp_w: float
    sm_clock_max_mhz: float
    memory_gb: float
    nvlinks: int
    pcie_gen_max: int
    pcie_width_max: int


PRESETS: dict[str, GpuPreset] = {
    "H100-SXM": GpuPreset("NVIDIA H100 80GB HBM3", 700.0, 1980.0, 80.0, 18, 5, 16),
    "H200-SXM": GpuPreset("NVIDIA H200", 700.0, 1980.0, 141.0, 18, 5, 16),
    "B200": GpuPreset("NVIDIA B200", 1000.0, 1965.0, 180.0, 18, 5, 16),
    "A100-SXM4-80GB": GpuPreset("NVIDIA A100-SXM4-80GB", 400.0, 1410.0, 80.0, 12, 4, 16),
    "L40S": GpuPreset("NVIDIA L40S", 350.0, 2520.0, 48.0, 0, 4, 16),
}


class GpuSpec(_Strict):
    """The node's GPUs: a preset ``model`` and any overrides (all of them for a model without a preset)."""

    model: str = "H100-SXM"
    count: Annotated[int, Field(ge=1, le=32)] = 8
    tdp_w: Annotated[float, Field(gt=0)] | None = None
    sm_clock_max_mhz: Annotated[float, Field(gt=0)] | None = None
    memory_gb: Annotated[float, Field(gt=0)] | None = None
    nvlinks: Annotated[int, Field(ge=0, le=36)] | None = None
    pcie_gen_max: Annotated[int, Field(ge=1, le=6)] | None = None
    pcie_width_max: Literal[1, 2, 4, 8, 16] | None = None
    mig: tuple[int, ...] = ()  # indices of GPUs in MIG mode

    @model_validator(mode="after")
    def _known_or_complete(self) -> GpuSpec:
        if self.model not in PRESETS:
            missing = [n for n in GpuPreset._fields[1:] if getattr(self, n) is None]
            if missing:
                raise ValueError(
                    f"model {self.model!r} has no preset (known: {', '.join(PRESETS)}); "
                    f"give {', '.join(missing)}"
                )
        bad = [i for i in self.mig if not 0 <= i < self.count]
        if bad:
            raise ValueError(f"mig: GPU index {bad[0]} out of range (count is {self.count})")
        return self

    @property
    def preset(self) -> GpuPreset:
        base = PRESETS.get(self.model)
        values: dict[str, Any] = {
            n: getattr(self, n) if getattr(self, n) is not None else (getattr(base, n) if base else None)
            for n in GpuPreset._fields[1:]
        }
        return GpuPreset(nvml_name=base.nvml_name if base else f"NVIDIA {self.model}", **values)


GpuSelector = int | tuple[int, ...] | Literal["all"]


class _FaultBase(_Strict):
    at: Annotated[float, Field(ge=0)] = 0.0
    gpu: GpuSelector = 0
    duration: Annotated[float, Field(gt=0)] | None = None
    recovery_action: Annotated[int, Field(ge=0, le=7)] | None = None  # NVML field 230 while active

    def gpu_indices(self, count: int) -> tuple[int, ...]:
        if self.gpu == "all":
            return tuple(range(count))
        if isinstance(self.gpu, int):
            return (self.gpu,)
        return tuple(self.gpu)

    def active(self, t: float) -> bool:
        return t >= self.at and (self.duration is None or t < self.at + self.duration)

    def started(self, t: float) -> bool:
        return t >= self.at


class XidFault(_FaultBase):
    """An Xid in the kernel log (and from ``wait_xids``); no effect on samples by itself."""

    kind: Literal["xid"] = "xid"
    code: Annotated[int, Field(ge=1, le=1023)]
    text: str | None = None  # default: a realistic driver message for the code
    pid: int | None = None
    process: str | None = None


class FallOffBus(_FaultBase):
    """Xid 79: every sample raises GpuLostError while active."""

    kind: Literal["fall_off_bus"] = "fall_off_bus"


class EccDbe(_FaultBase):
    """Uncorrectable ECC error(s): Xid 48 then Xid 63 (remap pending) or 64 (remap failure)."""

    kind: Literal["ecc_dbe"] = "ecc_dbe"
    count: Annotated[int, Field(ge=1)] = 1
    remap: Literal["pending", "failure"] = "pending"


class RowRemapFailure(_FaultBase):
    """Row remapping failed (Xid 64): ``remap_failure`` while active."""

    kind: Literal["row_remap_failure"] = "row_remap_failure"


class Thermal(_FaultBase):
    """Thermal slowdown: SwThermal (and HwThermal + HwSlowdown with ``hw``), clock drops, temp rises."""

    kind: Literal["thermal"] = "thermal"
    temp_c: float = 92.0
    clock_factor: Annotated[float, Field(gt=0, le=1)] = 0.7
    hw: bool = False


class PowerBrake(_FaultBase):
    """External power brake: HwSlowdown + HwPowerBrake, clock and power collapse."""

    kind: Literal["power_brake"] = "power_brake"
    clock_factor: Annotated[float, Field(gt=0, le=1)] = 0.35


class HwSlowdown(_FaultBase):
    kind: Literal["hw_slowdown"] = "hw_slowdown"
    clock_factor: Annotated[float, Field(gt=0, le=1)] = 0.5


class NvlinkDown(_FaultBase):
    """NVLink links go inactive (Xid 74 per link), NVLink traffic falls with them, recovery errors rise."""

    kind: Literal["nvlink_down"] = "nvlink_down"
    links: tuple[Annotated[int, Field(ge=0, le=35)], ...] = (0,)


class PcieDowntrain(_FaultBase):
    """The PCIe link trains at a lower width (default: half the maximum)."""

    kind: Literal["pcie_downtrain"] = "pcie_downtrain"
    width: Literal[1, 2, 4, 8] | None = None


class NcclHang(_FaultBase):
    """Ranks spin in the NCCL kernel: util ~100%, power ~30-40% of TDP, NVLink/PCIe traffic ~0."""

    kind: Literal["nccl_hang"] = "nccl_hang"


class StalledRank(_FaultBase):
    """A host-side stall: util ~0, power near idle, no traffic."""

    kind: Literal["stalled_rank"] = "stalled_rank"


class Straggler(_FaultBase):
    """A slow GPU: SM clock -15% (``clock_factor``), power a little lower, no clock-event reason."""

    kind: Literal["straggler"] = "straggler"
    clock_factor: Annotated[float, Field(gt=0, le=1)] = 0.85


Fault = Annotated[
    XidFault
    | FallOffBus
    | EccDbe
    | RowRemapFailure
    | Thermal
    | PowerBrake
    | HwSlowdown
    | NvlinkDown
    | PcieDowntrain
    | NcclHang
    | StalledRank
    | Straggler,
    Field(discriminator="kind"),
]

FAULT_KINDS: tuple[str, ...] = (
    "xid",
    "fall_off_bus",
    "ecc_dbe",
    "row_remap_failure",
    "thermal",
    "power_brake",
    "hw_slowdown",
    "nvlink_down",
    "pcie_downtrain",
    "nccl_hang",
    "stalled_rank",
    "straggler",
)


class Scenario(_Strict):
    seed: int = 0
    gpus: GpuSpec = GpuSpec()
    load: Literal["idle", "training"] = "training"
    faults: tuple[Fault, ...] = ()

    @model_validator(mode="after")
    def _faults_fit(self) -> Scenario:
        problem = check_faults(self.gpus, self.faults)
        if problem is not None:
            raise ValueError(problem)
        return self

    @classmethod
    def training(
        cls, gpus: int = 8, model: str = "H100-SXM", seed: int = 0, faults: Iterable[Fault] = (), **spec: Any
    ) -> Scenario:
        return cls(
            seed=seed, gpus=GpuSpec(model=model, count=gpus, **spec), load="training", faults=tuple(faults)
        )

    @classmethod
    def idle(
        cls, gpus: int = 8, model: str = "H100-SXM", seed: int = 0, faults: Iterable[Fault] = (), **spec: Any
    ) -> Scenario:
        return cls(
            seed=seed, gpus=GpuSpec(model=model, count=gpus, **spec), load="idle", faults=tuple(faults)
        )


def check_faults(spec: GpuSpec, faults: Sequence[_FaultBase]) -> str | None:
    """The first fault that does not fit the GPUs (as ``faults.<n>.<key>: reason``), or None."""
    nvlinks = spec.preset.nvlinks
    for n, fault in enumerate(faults):
        for i in fault.gpu_indices(spec.count):
            if not 0 <= i < spec.count:
                return f"faults.{n}.gpu: GPU index {i} out of range (count is {spec.count})"
        if isinstance(fault, NvlinkDown):
            for link in fault.links:
                if link >= nvlinks:
                    return f"faults.{n}.links: link {link} out of range ({spec.model} has {nvlinks} NVLinks)"
    return None


def _drop_fault_tag(loc: list[Any]) -> list[Any]:
    # a discriminated union puts the tag in the path (faults.0.thermal.bogus): drop it
    if len(loc) >= 3 and loc[0] == "faults" and isinstance(loc[1], int) and loc[2] in FAULT_KINDS:
        del loc[2]
    return loc


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate parsed YAML into a :class:`Scenario`; :class:`ConfigError` names the key path."""
    return parse_config(Scenario, data, source, loc_filter=_drop_fault_tag)


def load_scenario(path: Path) -> Scenario:
    return parse_scenario(load_yaml(path), str(path))
