"""A bound on the events one job's log can make. Pure, with an injected clock.

A job that prints the same NCCL warning in a loop must not flood the shipper or the engine: each (job, kind)
may make ``per_window`` events per ``window_s``; beyond it events are dropped and counted. At most
``max_keys`` (job, kind) pairs are tracked: the least recently used is forgotten first (forgetting one only
lets it start a fresh window).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["EventLimiter"]


class EventLimiter:
    def __init__(self, per_window: int = 100, window_s: float = 60.0, max_keys: int = 1024) -> None:
        self.per_window = per_window
        self.window_s = window_s
        self.max_keys = max_keys
        self._windows: OrderedDict[tuple[str | None, str], tuple[float, int]] = OrderedDict()
        self.dropped = 0

    def allow(self, job: str | None, kind: str, now: float) -> bool:
        key = (job, kind)
        start, count = self._windows.pop(key, (now, 0))
        if now - start >= self.window_s:
            start, count = now, 0
        allowed = count < self.per_window
        self._windows[key] = (start, count + 1 if allowed else count)
        while len(self._windows) > self.max_keys:
            self._windows.popitem(last=False)
        if not allowed:
            self.dropped += 1
        return allowed

    def __len__(self) -> int:
        return len(self._windows)
