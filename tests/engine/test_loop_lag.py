"""The loop-lag probe records how late its timer woke: near zero on an idle loop, the length of a stall when
the loop is held."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from watchd.engine.loop_lag import LoopLag


async def test_a_held_loop_shows_as_lag() -> None:
    registry = CollectorRegistry()
    probe = LoopLag(registry, probe_s=0.02)
    await probe.start()
    try:
        await asyncio.sleep(0.1)
        idle_count = registry.get_sample_value("watchd_event_loop_lag_seconds_count") or 0
        assert idle_count >= 2
        time.sleep(0.3)  # noqa: ASYNC251 - the loop held, as a long piece of work would
        await asyncio.sleep(0.05)
        over_quarter = registry.get_sample_value("watchd_event_loop_lag_seconds_bucket", {"le": "0.25"})
        count = registry.get_sample_value("watchd_event_loop_lag_seconds_count")
        assert (
            count is not None and over_quarter is not None and count - over_quarter >= 1
        )  # one woke > 0.25 s late
    finally:
        await probe.stop()
    assert probe._handle is None
