"""The agent's ``sources.gpu`` section: which GPU backend is read, how often, and the NVML cadences; and
``commands.gpu_reset``: how the agent resets a GPU when the engine asks. Pydantic and watchd's vocabulary
only: pynvml is not imported to load a config."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from watchd.model.durations import Seconds
from watchd.strict import Strict


class GpuSourceConfig(Strict):
    backend: Literal["nvml", "dcgm", "fake", "none"] = "nvml"
    interval_s: Seconds = 2.0
    summary_window_s: Seconds = 5.0
    health_report_interval_s: Seconds = 30.0
    scenario: Path | None = None  # backend fake: a GPU scenario file (tests, demos, the simulator)
    dcgm_url: Annotated[str, Field(pattern=r"^https?://")] = "http://127.0.0.1:9400/metrics"
    xid_dedup_window_s: Seconds = 10.0
    proc_root: Path = Path("/proc")
    # nvml backend cadences (docs/gpu-nvml-cost.md): slow-changing fields, and the energy counter
    # (4 ms CPU a read on an H200; the power integral in between)
    nvml_slow_interval_s: Seconds = 10.0
    nvml_energy_interval_s: Annotated[float, Field(ge=1.0, le=300.0)] = 30.0
    # the per-GPU gauges also carry the job holding the GPU (as before watchd_gpu_job_info): every job change
    # starts new series. Counters never carry it (increase() would break). docs/gpu-metrics.md
    job_label: bool = False

    @model_validator(mode="after")
    def _scenario_for_fake(self) -> GpuSourceConfig:
        if self.backend == "fake" and self.scenario is None:
            raise ValueError("backend fake needs a scenario file")
        return self


class GpuResetConfig(Strict):
    """How the agent resets a GPU (the engine's ``gpu_reset`` command; docs/remediation.md)."""

    # auto: the fake over the simulated GPUs when sources.gpu.backend is fake, else nvidia-smi
    backend: Literal["auto", "nvidia-smi", "fake"] = "auto"
    nvidia_smi: str = "nvidia-smi"  # the NVIDIA driver's utility (a path, or a name on PATH)
    timeout_s: Seconds = 120.0  # for one nvidia-smi --gpu-reset
    # the fake: how long a reset takes (seconds on real hardware), and a file it appends each reset to
    fake_delay_s: Annotated[float, Field(ge=0)] = 3.0
    fake_log: Path | None = None
    # where the agent looks for a job on the node before a reset (Slurm cgroups and processes, a pod's
    # processes holding the GPU): refused when it finds one (tests point these at fake trees)
    proc_root: Path = Path("/proc")
    cgroup_root: Path = Path("/sys/fs/cgroup")
