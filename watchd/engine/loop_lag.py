"""How late the engine's event loop runs: a timer asks to wake every :data:`PROBE_S` and records how much
later than asked it woke (``watchd_event_loop_lag_seconds``). Everything the engine does shares one loop, so
this is the wait any work had at that moment: an Xid arriving then, a status request, a lease renewal. Near
zero on an engine with headroom; at the fleet's summary bursts (docs/scale.md) it is what an Xid waits.

A bare loop timer, not an APScheduler job: the probe measures the loop, and a scheduler's own work and
coalescing would be measured with it.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Histogram

from watchd.subsystem import Component

PROBE_S = 0.25
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopLag(Component):
    name = "loop_lag"

    def __init__(self, registry: CollectorRegistry, probe_s: float = PROBE_S) -> None:
        self.probe_s = probe_s
        self.lag = Histogram(
            "watchd_event_loop_lag_seconds",
            "How much later than asked a timer on the engine's event loop woke (probed every 0.25 s): what "
            "any work waited then.",
            buckets=BUCKETS,
            registry=registry,
        )
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    async def start(self) -> None:
        self._arm()

    async def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self) -> None:
        self._due = time.monotonic() + self.probe_s
        self._handle = asyncio.get_running_loop().call_later(self.probe_s, self._woke)

    def _woke(self) -> None:
        self.lag.observe(max(0.0, time.monotonic() - self._due))
        self._arm()
