"""A faithful stand-in for resetting GPUs (:class:`watchd.gpu.reset.GpuResetter`), for tests and the
simulator: the same refusals and failures as ``nvidia-smi --gpu-reset`` (a GPU in use, a GPU fallen off the
bus), in the same words and exit statuses, and the same cost: a reset blocks for ``delay_s`` (seconds on real
hardware; 3 s by default).

Over the simulated GPUs (:class:`watchd.sim.gpu.FakeGpuBackend`, :func:`for_backend`): the processes holding
a GPU are the scenario's job's (a ``training`` scenario holds every GPU, an ``idle`` one none); a reset ends
the faults that had started on the GPUs it reset, so their readings recover; a GPU that fell off the bus is
not brought back by one (exit status 15, as nvidia-smi). ``log``: one JSON line per reset done, appended
(a test counts the resets across agent restarts from it)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from watchd.gpu.model import GpuIdentity
from watchd.gpu.reset import Holder, ResetFailed
from watchd.sim.gpu import FakeGpuBackend

__all__ = ["FakeGpuResetter", "for_backend"]

#: what nvidia-smi prints when a process holds a GPU it was asked to reset
IN_USE = (
    "The following GPUs could not be reset: GPU {bus}: In use by another client. 1 device is currently "
    "being used by one or more other processes (e.g., Fabric Manager, CUDA application, graphics "
    "application such as an X server, or a monitoring application such as another instance of nvidia-smi). "
    "Please first kill all processes using this device and all compute applications running in the system."
)
LOST = "Unable to reset GPU {bus}: GPU is lost. Reboot the system to recover this GPU"


def _nvml_bus(pci: str) -> str:
    """``0000:3b:00.0`` as nvidia-smi prints it: ``00000000:3B:00.0``."""
    domain, rest = pci.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


class FakeGpuResetter:
    name = "fake"

    def __init__(
        self,
        gpus: Callable[[], Sequence[GpuIdentity]],
        *,
        holders: Callable[[GpuIdentity], Sequence[int]] = lambda gpu: (),
        lost: Callable[[GpuIdentity], bool] = lambda gpu: False,
        on_reset: Callable[[Sequence[GpuIdentity]], None] = lambda gpus: None,
        delay_s: float = 3.0,
        log: Path | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._gpus = gpus
        self._holders = holders
        self._lost = lost
        self._on_reset = on_reset
        self.delay_s = delay_s
        self._log = log
        self._sleep = sleep
        self._lock = threading.Lock()
        #: the PCI bus ids of every reset done, in order
        self.resets: list[tuple[str, ...]] = []

    def gpus(self) -> list[GpuIdentity]:
        return list(self._gpus())

    def holders(self, gpu: GpuIdentity) -> list[Holder]:
        return [Holder(pid, "python3", gpu.pci_bus_id) for pid in self._holders(gpu)]

    def reset(self, gpu: GpuIdentity | None) -> None:
        targets = [gpu] if gpu is not None else self.gpus()
        shown = "nvidia-smi --gpu-reset" + (f" -i {gpu.uuid}" if gpu is not None else "")
        held = [t for t in targets if self._holders(t)]
        if held:  # a process took the GPU after the check: nvidia-smi refuses, as it would
            said = IN_USE.format(bus=_nvml_bus(held[0].pci_bus_id))
            raise ResetFailed(f"{shown}: exit status 255: {said}")
        self._sleep(self.delay_s)  # what a reset costs on real hardware
        lost = [t for t in targets if self._lost(t)]
        if lost:
            raise ResetFailed(f"{shown}: exit status 15: {LOST.format(bus=_nvml_bus(lost[0].pci_bus_id))}")
        done = tuple(t.pci_bus_id for t in targets)
        with self._lock:
            self.resets.append(done)
            if self._log is not None:
                line = json.dumps({"time": time.time(), "pid": os.getpid(), "gpus": list(done)})
                with open(self._log, "a") as f:
                    f.write(line + "\n")
        self._on_reset(targets)


def for_backend(backend: FakeGpuBackend, delay_s: float = 3.0, log: Path | None = None) -> FakeGpuResetter:
    """A resetter of the simulated GPUs of ``backend``: their processes, their faults, their recovery."""
    return FakeGpuResetter(
        lambda: backend.gpus,
        holders=lambda gpu: backend.processes(gpu.index),
        lost=lambda gpu: backend.lost(gpu.index, time.time()),
        on_reset=lambda gpus: backend.reset([g.index for g in gpus], time.time()),
        delay_s=delay_s,
        log=log,
    )
