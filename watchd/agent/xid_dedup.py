"""One Xid, two witnesses: the kernel log and NVML's event API both report it. Keep the first.

Only reports from *different* sources are merged: the same Xid logged twice by the kernel is two events
(repeated application Xids are what some rules count)."""

from __future__ import annotations

from watchd.clock import Clock


class XidDeduplicator:
    def __init__(self, clock: Clock, window_s: float = 10.0, max_keys: int = 10_000) -> None:
        self._clock = clock
        self._window = window_s
        self._max = max_keys
        self._seen: dict[tuple[str, int], tuple[float, str]] = {}
        self.suppressed = 0

    def first(self, pci_bus_id: str, xid: int, source: str) -> bool:
        """False when another source reported the same Xid on the same GPU within the window."""
        now = self._clock.monotonic()
        key = (pci_bus_id, xid)
        last = self._seen.pop(key, None)
        if last is not None and now - last[0] < self._window and last[1] != source:
            self._seen[key] = last  # the first witness stays the reference
            self.suppressed += 1
            return False
        self._seen[key] = (now, source)
        if len(self._seen) > self._max:
            del self._seen[next(iter(self._seen))]
        return True
