"""Recognise events seen before, by id, within a time window and a bounded memory."""

from __future__ import annotations

from collections import OrderedDict

from watchd.clock import Clock


class SeenIds:
    def __init__(self, clock: Clock, window_s: float, max_ids: int) -> None:
        self._clock = clock
        self._window = window_s
        self._max = max_ids
        self._seen: OrderedDict[str, float] = OrderedDict()

    def first_time(self, event_id: str) -> bool:
        """True the first time an id is offered within the window; False for a repeat."""
        now = self._clock.monotonic()
        self._expire(now)
        if event_id in self._seen:
            return False
        self._seen[event_id] = now
        if len(self._seen) > self._max:
            self._seen.popitem(last=False)
        return True

    def forget(self, event_id: str) -> None:
        """Un-see an id (its event was refused and will be sent again)."""
        self._seen.pop(event_id, None)

    def _expire(self, now: float) -> None:
        horizon = now - self._window
        seen = self._seen
        while seen:
            oldest = next(iter(seen.values()))
            if oldest >= horizon:
                break
            seen.popitem(last=False)

    def __len__(self) -> int:
        return len(self._seen)
