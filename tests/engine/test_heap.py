"""The engine's collector policy (engine/heap.py): the long-lived heap is frozen, a collection passes over
what is new, and the whole heap is collected once per ``full_every_s``."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry

from watchd.engine.heap import HeapPolicy


class _Cycle:
    def __init__(self) -> None:
        self.me = self


async def test_freezes_what_lives_collects_what_is_new_and_the_whole_heap_when_due() -> None:
    policy = HeapPolicy(freeze_every_s=10.0, full_every_s=3600.0)
    registry = CollectorRegistry()
    for collector in policy.collectors():
        registry.register(collector)
    try:
        await policy.start()
        assert gc.get_freeze_count() > 1000 and policy.full_s == 0
        frozen = gc.get_freeze_count()
        _Cycle()  # garbage in a cycle, made after the freeze: the next round collects it
        await policy.freeze()
        assert policy.young_s > 0 and gc.get_freeze_count() >= frozen - 100
        assert registry.get_sample_value("watchd_gc_frozen_objects") == gc.get_freeze_count()
        policy.full_every_s = 0.0  # due: the heap unfrozen and collected whole, then frozen again
        before = policy.full_s
        await policy.freeze()
        assert policy.full_s != before and gc.get_freeze_count() > 1000
    finally:
        await policy.stop()
    assert gc.get_freeze_count() == 0


async def test_no_automatic_full_collection_while_it_runs_and_the_thresholds_come_back() -> None:
    """The collector's own oldest-generation collections would pass over everything since the last freeze
    every few seconds: while the policy runs, only its rounds collect."""
    before = gc.get_threshold()
    policy = HeapPolicy()
    await policy.start()
    try:
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] >= 100_000
        full = gc.get_stats()[2]["collections"]
        for _ in range(200_000):
            _Cycle()  # enough allocations for many young collections
        assert gc.get_stats()[2]["collections"] == full
    finally:
        await policy.stop()
    assert gc.get_threshold() == before
