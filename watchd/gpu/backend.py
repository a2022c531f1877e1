"""The GPU backend interface: what the agent's sampler needs from NVML, the fake, or anything else. Backends
are built by the name ``sources.gpu.backend`` gives them, from :mod:`watchd.gpu.registry`.

Every method blocks: the agent runs them in worker threads (``asyncio.to_thread``). Threading contract, kept
by every implementation here:

* ``open()`` first, ``close()`` last, neither concurrently with any other call.
* ``sample()`` and ``wait_xids()`` may run at the same time in two different threads (one sampler thread,
  one Xid-event thread); ``sample()`` calls are not concurrent with each other, nor ``wait_xids()`` calls.
* ``wait_xids(timeout_s)`` returns within about ``timeout_s`` even when nothing happens, so a short timeout
  (1 s) keeps shutdown prompt; call ``close()`` only after the waiting thread has returned.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from watchd.gpu.model import GpuIdentity, GpuSample

__all__ = ["GpuBackend", "XidNotice"]


class XidNotice(NamedTuple):
    """One Xid reported by the backend itself (not the kernel log): the GPU, the Xid number, a short text,
    and on a GPU in MIG mode the GPU instance and compute instance it was attributed to (when known)."""

    gpu: GpuIdentity
    xid: int
    text: str
    gpu_instance: int | None = None
    compute_instance: int | None = None


class GpuBackend(Protocol):
    name: str

    def open(self) -> list[GpuIdentity]:
        """Start the backend and list the GPUs it sees, in index order.

        Raises :class:`~watchd.gpu.model.BackendUnavailable` (a clear one-line reason) when there is no
        GPU library or driver on this machine."""
        ...

    def sample(self, gpu: GpuIdentity, now: float) -> GpuSample:
        """One reading of ``gpu``, stamped ``now``. Fields this GPU does not support are None; a field that
        failed this time is None too (never an exception). Raises :class:`~watchd.gpu.model.GpuLostError`
        when the GPU stopped answering."""
        ...

    def wait_xids(self, timeout_s: float) -> list[XidNotice]:
        """Block up to ``timeout_s`` for Xid events; [] on timeout (or when the backend has no events)."""
        ...

    def close(self) -> None:
        """Release the library; idempotent."""
        ...
