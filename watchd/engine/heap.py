"""The engine's garbage-collector policy: what lives long is frozen, so a full collection passes over what is
new, not over the whole fleet's state.

The detectors keep about 60 windows per GPU (``detectors.history_s``), each an object CPython's cyclic
collector tracks; at 100,000 GPUs, millions. A fleet's windows are replaced at a steady rate, so a full
(generation 2) collection comes every few seconds, and each passes over the whole heap with the event loop
held: measured at 12,000 GPUs, 0.15-0.37 s every 5-8 s, growing with the heap (an Xid under load decided in
1.1 s at p99 against 19 ms idle; benchmarks/scale_100k.py, docs/scale.md).

Every :data:`FREEZE_EVERY_S` the objects created since the last time are collected (those are all a
collection passes over: the rest is frozen) and what survives is frozen (:func:`gc.freeze`): the permanent
generation, which no collection visits. A frozen object is still freed when its last reference goes (a window
that ages out, a closed connection); only cyclic garbage that includes an object frozen earlier waits, until
every :data:`FULL_EVERY_S` the heap is unfrozen and collected whole once (a pause of the heap's size, counted
in ``watchd_gc_full_collection_seconds``).

Between those rounds the collector's own oldest-generation collections are turned off (its third threshold
raised): with the heap frozen, its rule for them (a quarter more survivors than the last full collection
found) was met every few seconds, and each passed over every object since the last freeze. At 2,500 agents
(20,000 GPUs) that was 27 collections in 85 s, up to 0.29 s each with the loop held (the young ones, run by
this policy, are as short as the interval: every 2 s rather than 10).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from watchd.logs import get_logger
from watchd.subsystem import Component, Job

_log = get_logger("watchd.engine.heap")

FREEZE_EVERY_S = 2.0
#: the collector's third threshold while the policy runs: its own oldest-generation collections never come
NO_AUTOMATIC_FULL = 1_000_000
FULL_EVERY_S = 3600.0


class HeapPolicy(Component):
    name = "heap"

    def __init__(self, freeze_every_s: float = FREEZE_EVERY_S, full_every_s: float = FULL_EVERY_S) -> None:
        self.freeze_every_s = freeze_every_s
        self.full_every_s = full_every_s
        self._last_full = time.monotonic()
        self.young_s = 0.0  # the last collection of what was not frozen
        self.full_s = 0.0  # the last whole-heap collection (every full_every_s)
        self._thresholds: tuple[int, int, int] | None = None  # the collector's, restored at stop

    def jobs(self) -> Sequence[Job]:
        return [Job("heap-freeze", self.freeze_every_s, self.freeze)]

    async def start(self) -> None:
        gc.freeze()  # what the start built is long-lived (no collection first: one costs as much as the heap)
        self._last_full = time.monotonic()
        self._thresholds = gc.get_threshold()
        young, middle, _ = self._thresholds
        gc.set_threshold(young, middle, NO_AUTOMATIC_FULL)

    async def stop(self) -> None:
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None
        gc.unfreeze()

    async def freeze(self) -> None:
        if time.monotonic() - self._last_full >= self.full_every_s:
            self._full()
        else:
            t0 = time.perf_counter()
            gc.collect()  # what is not frozen: the objects since the last freeze
            self.young_s = time.perf_counter() - t0
        gc.freeze()

    def _full(self) -> None:
        gc.unfreeze()
        t0 = time.perf_counter()
        found = gc.collect()
        self.full_s = time.perf_counter() - t0
        self._last_full = time.monotonic()
        _log.info("heap_collected", seconds=round(self.full_s, 3), unreachable=found)

    def collectors(self) -> Sequence[Collector]:
        return [_HeapCollector(self)]


class _HeapCollector(Collector):
    def __init__(self, policy: HeapPolicy) -> None:
        self._policy = policy

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "watchd_gc_frozen_objects",
            "Objects in the garbage collector's permanent generation (frozen: no collection visits them).",
            value=gc.get_freeze_count(),
        )
        yield GaugeMetricFamily(
            "watchd_gc_young_collection_seconds",
            "The last collection of the objects not frozen (every 2 s, on the event loop).",
            value=self._policy.young_s,
        )
        yield GaugeMetricFamily(
            "watchd_gc_full_collection_seconds",
            "The last collection of the whole heap (hourly, on the event loop; 0 before the first).",
            value=self._policy.full_s,
        )
