"""The GPU backends by name, as ``sources.gpu.backend`` names them, and the GPU resetters
(``commands.gpu_reset.backend``). Each is imported only when configured: the
agent loads NVML, the dcgm-exporter client or the simulation code only where it uses it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from watchd.errors import ConfigError
from watchd.gpu.backend import GpuBackend
from watchd.gpu.reset import GpuResetter, NvidiaSmiResetter
from watchd.gpu.settings import GpuResetConfig, GpuSourceConfig

KernelLog = Callable[[str], None]  # where a simulated driver writes its kernel-log lines (thread-safe)
BackendFactory = Callable[[GpuSourceConfig, KernelLog], GpuBackend]
NONE = "none"  # no GPU sampling


def _nvml(config: GpuSourceConfig, kernel_log: KernelLog) -> GpuBackend:
    from watchd.gpu.nvml import NvmlBackend

    return NvmlBackend(
        slow_interval_s=config.nvml_slow_interval_s, energy_interval_s=config.nvml_energy_interval_s
    )


def _dcgm(config: GpuSourceConfig, kernel_log: KernelLog) -> GpuBackend:
    from watchd.gpu.dcgm_backend import DcgmBackend

    return DcgmBackend(config.dcgm_url, max_age_s=config.interval_s / 2)


def _fake(config: GpuSourceConfig, kernel_log: KernelLog) -> GpuBackend:
    from watchd.sim.gpu import FakeGpuBackend
    from watchd.sim.scenario import load_scenario

    if config.scenario is None:
        raise ConfigError("sources.gpu.scenario: backend fake needs a scenario file")
    return FakeGpuBackend(load_scenario(config.scenario), time.time(), on_kernel_log=kernel_log)


GPU_BACKENDS: dict[str, BackendFactory] = {"nvml": _nvml, "dcgm": _dcgm, "fake": _fake}


def backend_from_config(config: GpuSourceConfig, kernel_log: KernelLog) -> GpuBackend | None:
    """The backend ``sources.gpu.backend`` names; None for ``none``."""
    if config.backend == NONE:
        return None
    factory = GPU_BACKENDS.get(config.backend)
    if factory is None:
        known = ", ".join([*sorted(GPU_BACKENDS), NONE])
        raise ConfigError(f"sources.gpu.backend: unknown GPU backend {config.backend!r} (known: {known})")
    return factory(config, kernel_log)


def resetter_from_config(
    config: GpuResetConfig, backend: GpuBackend | None, proc_root: Path = Path("/proc")
) -> GpuResetter:
    """How ``commands.gpu_reset`` resets a GPU: ``nvidia-smi``, or the fake over the simulated GPUs of
    ``backend`` (``auto``: the fake exactly when the GPUs are simulated). The simulation is imported only
    then."""
    simulated = backend is not None and backend.name == "fake"
    if config.backend == "fake" or (config.backend == "auto" and simulated):
        from watchd.sim.gpu import FakeGpuBackend
        from watchd.sim.gpu_reset import for_backend

        if not isinstance(backend, FakeGpuBackend):
            raise ConfigError("commands.gpu_reset.backend fake: needs sources.gpu.backend fake")
        return for_backend(backend, config.fake_delay_s, config.fake_log)
    return NvidiaSmiResetter(config.nvidia_smi, config.timeout_s, proc_root=proc_root)
