"""The GPU backends by name, as ``sources.gpu.backend`` names them. Each is imported only when configured: the
agent loads NVML, the dcgm-exporter client or the simulation code only where it uses it."""

from __future__ import annotations

import time
from collections.abc import Callable

from watchd.errors import ConfigError
from watchd.gpu.backend import GpuBackend
from watchd.gpu.settings import GpuSourceConfig

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
