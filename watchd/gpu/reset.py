"""Resetting the GPUs of the agent's own node, as the engine's ``gpu_reset`` command asks: behind one small
interface (:class:`GpuResetter`) with a real implementation (:class:`NvidiaSmiResetter`: NVML for the GPUs
and the processes that hold them, ``nvidia-smi --gpu-reset`` for the reset) and a faithful fake
(:class:`watchd.sim.gpu_reset.FakeGpuResetter`: the same errors, the same seconds).

:func:`reset_gpus` is the procedure, the same over either: enumerate the GPUs, pick the target (one GPU by
PCI bus id, or every GPU of the node), **refuse** while any process holds a target (compute or graphics,
as NVML lists them: nothing is touched), reset, enumerate again and check every target came back. Every call
blocks (seconds, on real hardware): the agent runs it in a thread, with its own GPU sampling paused (NVML
open in the agent is "a monitoring application" to ``nvidia-smi --gpu-reset``, which refuses then).

``nvidia-smi --gpu-reset`` needs root with the administrator capability (``CAP_SYS_ADMIN``: the driver
refuses anyone else, "Insufficient Permissions"); the real resetter says so before it tries."""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from watchd.gpu.model import GpuIdentity
from watchd.logs import get_logger
from watchd.xid.pci import normalize_pci

__all__ = [
    "GpuResetter",
    "Holder",
    "NvidiaSmiResetter",
    "ResetFailed",
    "ResetRefused",
    "ResetReport",
    "reset_gpus",
]

_log = get_logger("watchd.gpu.reset")

#: nvidia-smi's exit statuses (nvidia-smi(1), "RETURN VALUE") that mean nothing was done: invalid argument,
#: not supported, no permission, not found, driver not loaded, library not found, function not found
_NOTHING_DONE = {2: "invalid argument", 3: "not supported", 4: "insufficient permissions", 6: "not found",
                 9: "driver not loaded", 12: "NVML library not found", 13: "function not found"}  # fmt: skip
_CAP_SYS_ADMIN = 21
_MAX_OUTPUT = 600


class ResetRefused(Exception):
    """Not reset, and nothing was touched: a process holds the GPU, no such GPU, no permission."""


class ResetFailed(Exception):
    """The reset was tried and did not succeed, or the GPU did not come back: its state is not known."""


@dataclass(frozen=True, slots=True)
class Holder:
    """A process that holds a GPU (NVML's compute or graphics processes)."""

    pid: int
    name: str
    gpu: str  # the GPU's PCI bus id


@dataclass(frozen=True, slots=True)
class ResetReport:
    gpus: tuple[str, ...]  # the PCI bus ids reset
    seconds: float
    after: tuple[GpuIdentity, ...]  # the node's GPUs enumerated after the reset


class GpuResetter(Protocol):
    """One way to reset this node's GPUs. Every method blocks; none is called concurrently with another."""

    name: str

    def gpus(self) -> list[GpuIdentity]:
        """The node's GPUs, enumerated now. Raises ResetRefused when they cannot be (no driver)."""
        ...

    def holders(self, gpu: GpuIdentity) -> list[Holder]:
        """The processes holding ``gpu`` now. Raises ResetRefused when that cannot be told."""
        ...

    def reset(self, gpu: GpuIdentity | None) -> None:
        """Reset ``gpu`` (None: every GPU of the node at once, as NVSwitch systems may need). Raises
        ResetRefused when the tool refused before touching anything, ResetFailed when the reset failed."""
        ...


def reset_gpus(
    resetter: GpuResetter, target: str, clock: Callable[[], float] = time.monotonic
) -> ResetReport:
    """Reset ``target`` (a normalized PCI bus id; "" for every GPU of the node) through ``resetter``: refused
    while any process holds a target; each target must be enumerated again afterwards."""
    before = resetter.gpus()
    targets = [g for g in before if not target or g.pci_bus_id == target]
    if not targets:
        seen = ", ".join(g.pci_bus_id for g in before) or "none"
        raise ResetRefused(
            f"no GPU {target} on this node (it has: {seen})" if target else "no GPU on this node"
        )
    held = [h for g in targets for h in resetter.holders(g)]
    if held:
        listed = ", ".join(f"pid {h.pid} ({h.name}) on GPU {h.gpu}" for h in held[:10])
        more = f" and {len(held) - 10} more" if len(held) > 10 else ""
        raise ResetRefused(f"in use: {listed}{more}: not reset")
    start = clock()
    resetter.reset(targets[0] if target else None)
    after = _enumerate_after(resetter)
    seconds = round(clock() - start, 3)
    missing = [g.pci_bus_id for g in targets if g.pci_bus_id not in {a.pci_bus_id for a in after}]
    if missing:
        raise ResetFailed(f"GPU {', '.join(missing)} not seen after the reset ({len(after)} GPUs are)")
    return ResetReport(tuple(g.pci_bus_id for g in targets), seconds, tuple(after))


def _enumerate_after(resetter: GpuResetter) -> list[GpuIdentity]:
    try:
        return resetter.gpus()
    except ResetRefused as exc:  # after a reset, not seeing the GPUs is a failure of the reset
        raise ResetFailed(f"the GPUs could not be enumerated after the reset: {exc}") from exc


def has_cap_sys_admin(status: Path = Path("/proc/self/status")) -> bool | None:
    """Whether this process holds CAP_SYS_ADMIN (what the driver asks of a GPU reset); None: unknown."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> _CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvidiaSmiResetter:
    """NVML (``pynvml``, or ``lib``) for the GPUs and their processes; ``nvidia-smi --gpu-reset -i <UUID>``
    (or without ``-i`` for every GPU) for the reset, within ``timeout_s``."""

    name = "nvidia-smi"

    def __init__(
        self,
        nvidia_smi: str = "nvidia-smi",
        timeout_s: float = 120.0,
        *,
        lib: Any = None,
        proc_root: Path = Path("/proc"),
        capable: Callable[[], bool | None] = has_cap_sys_admin,
        run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    ) -> None:
        self.nvidia_smi = nvidia_smi
        self.timeout_s = timeout_s
        self._lib = lib
        self._proc = proc_root
        self._capable = capable
        self._run = run

    def _nvml(self) -> Any:
        if self._lib is None:
            try:
                self._lib = importlib.import_module("pynvml")
            except ImportError as exc:
                raise ResetRefused("the Python NVML bindings are not installed (nvidia-ml-py)") from exc
        return self._lib

    @contextlib.contextmanager
    def _session(self) -> Any:
        lib = self._nvml()
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            raise ResetRefused(f"NVML: {exc}") from exc
        try:
            yield lib
        finally:
            with contextlib.suppress(lib.NVMLError):
                lib.nvmlShutdown()

    def gpus(self) -> list[GpuIdentity]:
        with self._session() as lib:
            try:
                count = lib.nvmlDeviceGetCount()
            except lib.NVMLError as exc:
                raise ResetRefused(f"NVML could not enumerate the GPUs: {exc}") from exc
            out = []
            for index in range(count):
                try:
                    handle = lib.nvmlDeviceGetHandleByIndex(index)
                    uuid = _text(lib.nvmlDeviceGetUUID(handle))
                    bus = normalize_pci(_text(lib.nvmlDeviceGetPciInfo(handle).busId)) or ""
                    out.append(GpuIdentity(index, uuid, bus, _text(lib.nvmlDeviceGetName(handle))))
                except lib.NVMLError as exc:  # lost (off the bus): not one a reset brings back
                    _log.warning("gpu_not_enumerated", index=index, error=str(exc))
            return out

    def holders(self, gpu: GpuIdentity) -> list[Holder]:
        with self._session() as lib:
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(gpu.index)
                if normalize_pci(_text(lib.nvmlDeviceGetPciInfo(handle).busId)) != gpu.pci_bus_id:
                    raise ResetRefused(f"GPU {gpu.pci_bus_id} moved from index {gpu.index}: not reset")
                procs = list(lib.nvmlDeviceGetComputeRunningProcesses(handle))
                graphics = getattr(lib, "nvmlDeviceGetGraphicsRunningProcesses", None)
                if graphics is not None:
                    with contextlib.suppress(lib.NVMLError_NotSupported):
                        procs += list(graphics(handle))
            except lib.NVMLError as exc:
                raise ResetRefused(
                    f"could not tell whether a process holds GPU {gpu.pci_bus_id} (NVML: {exc}): not reset"
                ) from exc
        pids = sorted({int(p.pid) for p in procs})
        return [Holder(pid, self._comm(pid), gpu.pci_bus_id) for pid in pids]

    def _comm(self, pid: int) -> str:
        try:
            return (self._proc / str(pid) / "comm").read_text().strip() or "?"
        except OSError:
            return "?"

    def reset(self, gpu: GpuIdentity | None) -> None:
        if self._capable() is False:
            raise ResetRefused(
                "the agent lacks CAP_SYS_ADMIN, which the driver asks of a GPU reset (systemd: the drop-in "
                "in docs/remediation.md)"
            )
        argv = [self.nvidia_smi, "--gpu-reset", *(["-i", gpu.uuid] if gpu is not None else [])]
        shown = " ".join(argv)
        _log.warning("gpu_reset_running", command=shown)
        try:
            done = self._run(argv, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except FileNotFoundError as exc:
            raise ResetRefused(f"{self.nvidia_smi}: not found (the NVIDIA driver's utilities)") from exc
        except subprocess.TimeoutExpired as exc:
            raise ResetFailed(f"{shown}: did not finish in {self.timeout_s:g} s") from exc
        if done.returncode == 0:
            return
        said = " ".join(f"{done.stdout or ''} {done.stderr or ''}".split())[:_MAX_OUTPUT]
        if done.returncode in _NOTHING_DONE:
            raise ResetRefused(
                f"{shown}: exit status {done.returncode} ({_NOTHING_DONE[done.returncode]}): {said}"
            )
        raise ResetFailed(f"{shown}: exit status {done.returncode}: {said}")


def describe_gpus(gpus: Sequence[GpuIdentity]) -> list[dict[str, Any]]:
    """The GPUs as a result reports them (JSON)."""
    return [{"index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id} for g in gpus]
