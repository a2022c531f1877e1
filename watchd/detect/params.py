"""Detector parameters: the ``detectors:`` section of the engine config, overridable per partition.

    detectors:
      hang: {for_s: 20}
      straggler: {for_s: 180}
      partitions:
        inference: {hang: {enabled: false}}

A partition's override names only what differs; the rest comes from the top level.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from watchd.strict import Strict as _Strict

Seconds = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]


class HangParams(_Strict):
    """NCCL hang from NVML alone: most of a job's GPUs spin (utilization high, power collapsed against the
    GPU's own running baseline, link traffic stopped) for ``for_s``."""

    enabled: bool = True
    for_s: Seconds = Field(
        default=10.0,
        description="the spin signature must hold this long on at least ``fraction`` of the GPUs (counted "
        "from the agents' nccl_spin, else from the windows)",
    )
    fraction: Fraction = Field(default=0.5, description="at least this share of the job's GPUs spinning")
    spin_util: Annotated[float, Field(ge=0, le=100)] = 90.0
    spin_power_ratio: Fraction = Field(
        default=0.6, description="power at most this share of the GPU's baseline"
    )
    spin_link_ratio: Fraction = Field(
        default=0.1, description="NVLink+PCIe traffic at most this share of baseline"
    )
    warmup_s: Seconds = Field(default=30.0, description="a job is judged once its GPUs computed this long")
    culprit_lookback_s: Seconds = Field(
        default=120.0, description="hardware events this long before onset count"
    )


class HostStallParams(_Strict):
    """Host-side stall: all of a job's GPUs idle at once after it computed (data loader, storage)."""

    enabled: bool = True
    for_s: Seconds = 120.0
    fraction: Fraction = 0.9
    idle_util: Annotated[float, Field(ge=0, le=100)] = 10.0


class HeartbeatParams(_Strict):
    """Hang from job heartbeats: the ranks' steps stop advancing."""

    enabled: bool = True
    min_stall_s: Seconds = Field(default=10.0, description="no step for at least this long ...")
    step_factor: Annotated[float, Field(ge=1)] = Field(
        default=5.0, description="... and this many median steps"
    )
    fraction: Fraction = Field(
        default=0.5, description="share of the job's training ranks that must be stalled"
    )
    min_steps: Annotated[int, Field(ge=1)] = Field(
        default=3, description="steps a rank reports before it is judged"
    )
    corroborated_stall_s: Seconds = Field(
        default=4.0,
        description="while most of the job's GPUs spin (NVML): no step for this long (and 2 median steps)",
    )


class StragglerParams(_Strict):
    """One GPU persistently slower than its job peers (robust outlier test across the job's GPUs)."""

    enabled: bool = True
    window_s: Seconds = Field(default=30.0, description="each GPU's SM clock is its median over this window")
    for_s: Seconds = Field(default=30.0, description="the outlier must persist this long")
    min_gpus: Annotated[int, Field(ge=3)] = 4
    clock_drop: Fraction = Field(
        default=0.05, description="at least this far below the job's median clock ..."
    )
    mad_k: Annotated[float, Field(gt=0)] = Field(
        default=5.0, description="... and this many scaled MADs below it"
    )
    compute_drop: Fraction = Field(
        default=0.10, description="heartbeats: compute time this much above the median"
    )
    reason_frac: Fraction = Field(default=0.5, description="clock-event reason set in this share of samples")
    fleet_clock_drop: Fraction = Field(
        default=0.05, description="below the fleet median for its model by this"
    )
    report_every_s: Seconds = Field(default=60.0, description="re-report while it lasts (with duration_s)")


class DetectorParams(_Strict):
    hang: HangParams = HangParams()
    host_stall: HostStallParams = HostStallParams()
    heartbeat: HeartbeatParams = HeartbeatParams()
    straggler: StragglerParams = StragglerParams()
    clear_after_s: Seconds = Field(default=30.0, description="a finding's condition gone this long ends it")


class DetectorsConfig(DetectorParams):
    interval_s: Seconds = Field(default=5.0, description="how often the detectors run")
    watch_interval_s: float = Field(
        default=1.0,
        ge=0,
        description="between cycles, the hang detector judges the jobs whose GPUs their agents say spin "
        "this often (0: only in cycles)",
    )
    history_s: Seconds = Field(default=300.0, description="per-GPU window history kept")
    max_nodes: int = Field(
        default=131_072, ge=1, description="nodes whose state is kept; the least recently reporting evicted"
    )
    max_state_mib: float = Field(
        default=2048.0,
        gt=0,
        description="memory the detectors' fleet state may take (estimated); the least recently reporting "
        "nodes evicted beyond it",
    )
    partitions: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per partition: the same keys, only those that differ"
    )

    _by_partition: dict[str, DetectorParams] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _resolve_partitions(self) -> DetectorsConfig:
        base = self._by_partition[""] = DetectorParams(
            **{k: getattr(self, k) for k in DetectorParams.model_fields}
        )
        for name, over in self.partitions.items():
            try:
                self._by_partition[name] = merged(base, over)
            except (ValueError, ValidationError) as exc:
                raise ValueError(f"partitions.{name}: {exc}") from None
        return self

    def for_partition(self, partition: str | None) -> DetectorParams:
        """The parameters in force for a job in ``partition``."""
        found = self._by_partition.get(partition or "")
        return found if found is not None else self._by_partition[""]


def merged(base: DetectorParams, override: dict[str, Any]) -> DetectorParams:
    data = base.model_dump()
    for key, value in override.items():
        if key not in data:
            raise ValueError(f"unknown key {key!r}")
        if isinstance(value, dict) and isinstance(data[key], dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return DetectorParams.model_validate(data)
