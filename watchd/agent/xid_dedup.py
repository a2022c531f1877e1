"""One Xid, two witnesses: the kernel log and NVML's event API both report it. Keep the first.

Only reports from *different* sources are merged: the same Xid logged twice by the kernel is two events
(repeated application Xids are what some rules count). On a MIG GPU the kernel and NVML name the GPU
instance and compute instance of each Xid: reports naming different instances of one GPU are different
faults, never merged. A report that names no instance (DCGM's, a GPU-wide Xid) is merged with a report of
any instance of that GPU and Xid."""

from __future__ import annotations

from watchd.clock import Clock

#: (GPU instance, compute instance) of a MIG Xid, or None when the report names none.
Instance = tuple[int | None, int | None] | None

_MAX_INSTANCES = 64  # per GPU and Xid; MIG has at most 7 GPU instances, each with a few compute instances


class XidDeduplicator:
    def __init__(self, clock: Clock, window_s: float = 10.0, max_keys: int = 10_000) -> None:
        self._clock = clock
        self._window = window_s
        self._max = max_keys
        # (pci, xid) -> instance -> (when, source) of the first witness
        self._seen: dict[tuple[str, int], dict[Instance, tuple[float, str]]] = {}
        self.suppressed = 0

    def first(
        self,
        pci_bus_id: str,
        xid: int,
        source: str,
        gpu_instance: int | None = None,
        compute_instance: int | None = None,
    ) -> bool:
        """False when another source reported the same Xid on the same GPU (and the same MIG instance, when
        both reports name one) within the window."""
        now = self._clock.monotonic()
        key = (pci_bus_id, xid)
        instance: Instance = None if gpu_instance is None else (gpu_instance, compute_instance)
        witnesses = self._seen.pop(key, {})
        self._seen[key] = witnesses  # most recently seen last: the oldest key is dropped first
        for seen, (when, by) in witnesses.items():
            if by != source and now - when < self._window and (None in (seen, instance) or seen == instance):
                self.suppressed += 1  # the first witness stays the reference
                return False
        witnesses.pop(instance, None)
        witnesses[instance] = (now, source)
        if len(witnesses) > _MAX_INSTANCES:
            del witnesses[next(iter(witnesses))]
        if len(self._seen) > self._max:
            del self._seen[next(iter(self._seen))]
        return True
