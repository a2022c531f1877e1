"""One Xid, two witnesses: the kernel log and NVML's event API both report it. Keep the first."""

from __future__ import annotations

from watchd.clock import Clock


class XidDeduplicator:
    def __init__(self, clock: Clock, window_s: float = 10.0, max_keys: int = 10_000) -> None:
        self._clock = clock
        self._window = window_s
        self._max = max_keys
        self._seen: dict[tuple[str, int], float] = {}
        self.suppressed = 0

    def first(self, pci_bus_id: str, xid: int) -> bool:
        """True unless the same Xid on the same GPU was reported within the window (by any source)."""
        now = self._clock.monotonic()
        key = (pci_bus_id, xid)
        last = self._seen.get(key)
        self._seen.pop(key, None)
        self._seen[key] = now
        if len(self._seen) > self._max:
            del self._seen[next(iter(self._seen))]
        if last is not None and now - last < self._window:
            self.suppressed += 1
            return False
        return True
