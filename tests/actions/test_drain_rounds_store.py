"""A drain round meeting a failure of the state database (its safety gate reads and writes the breaker's
window): only that drain waits and is tried again in a later round, never the whole round; past the bound it
is interrupted, its intent left open, and driven again once the store answers. Nothing lost, nothing done
twice, the breaker counting each node once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.actions.test_executor import make, rule_engine
from tests.support import xid_event
from watchd.actions import drain_batcher
from watchd.actions.drain_batcher import DrainBatcher
from watchd.actions.outcome import Outcome
from watchd.actions.safety import Verdict
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.store.connection import Fenced, StoreError


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain_batcher, "STORE_RETRY_S", 0.01)
    monkeypatch.setattr(drain_batcher, "STORE_RETRY_MAX_S", 0.02)
    monkeypatch.setattr(drain_batcher, "STORE_RETRIES", 3)


class Gate:
    """A safety gate that fails on the store its first ``failures`` times, then allows (counted)."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.asked = 0
        self.allowed = 0

    def __call__(self) -> Verdict:
        self.asked += 1
        if self.asked <= self.failures:
            raise StoreError("postgresql://watchd@db/watchd: reading the breaker window: connection lost")
        self.allowed += 1
        return Verdict(True)


def drained_rounds(fake: FakeScheduler) -> list[list[str]]:
    return [sorted(c[1]) for c in fake.calls if c[0] == "drain"]


async def test_a_gate_failing_on_the_store_costs_only_its_own_drain_which_a_later_round_does() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2", "gpu-3"])
    seen: list[str] = []
    batcher = DrainBatcher(fake, seen.append)
    gates = {"gpu-1": Gate(), "gpu-2": Gate(failures=1), "gpu-3": Gate()}
    batcher.start()
    try:
        results = await asyncio.gather(*(batcher.drain(n, "Xid 79", gates[n]) for n in gates))
    finally:
        await batcher.stop()
    assert [r.outcome for r in results] == [Outcome.DRAINED] * 3
    assert drained_rounds(fake) == [["gpu-1", "gpu-3"], ["gpu-2"]]
    assert [g.allowed for g in gates.values()] == [1, 1, 1]  # counted once each
    assert seen == ["retried"]


async def test_a_drain_whose_gate_keeps_failing_is_interrupted_after_the_bound() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2"])
    seen: list[str] = []
    batcher = DrainBatcher(fake, seen.append)
    batcher.start()
    try:
        stuck, fine = await asyncio.gather(
            batcher.drain("gpu-1", "Xid 79", Gate(failures=100)), batcher.drain("gpu-2", "Xid 79", Gate())
        )
    finally:
        await batcher.stop()
    assert stuck.outcome == Outcome.INTERRUPTED and "state database failed in 4 drain rounds" in stuck.detail
    assert fine.outcome == Outcome.DRAINED
    assert seen == ["retried", "retried", "retried", "interrupted"]
    assert drained_rounds(fake) == [["gpu-2"]]
    assert not fake.nodes["gpu-1"].drained


async def test_a_fenced_gate_interrupts_its_drain_at_once() -> None:
    """Another engine leads now (the breaker's write was fenced): nothing to wait for here; the intent stays
    open for the leader, which drives it."""

    def fenced() -> Verdict:
        raise Fenced("postgresql://watchd@db/watchd: recording a disruption of gpu-1: not the leader")

    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    seen: list[str] = []
    batcher = DrainBatcher(fake, seen.append)
    batcher.start()
    try:
        result = await batcher.drain("gpu-1", "Xid 79", fenced)
    finally:
        await batcher.stop()
    assert result.outcome == Outcome.INTERRUPTED and "driven by the engine that leads" in result.detail
    assert seen == ["interrupted"] and drained_rounds(fake) == []


async def test_a_request_for_a_node_waiting_on_the_store_joins_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain_batcher, "STORE_RETRY_S", 0.2)
    monkeypatch.setattr(drain_batcher, "STORE_RETRY_MAX_S", 0.2)
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    gate = Gate(failures=1)
    batcher = DrainBatcher(fake)
    batcher.start()
    try:
        first = asyncio.ensure_future(batcher.drain("gpu-1", "Xid 79", gate))
        await asyncio.sleep(0.05)  # its round failed on the store: it waits
        second = await batcher.drain("gpu-1", "Xid 79 again", Gate())
        assert (await first).outcome == second.outcome == Outcome.DRAINED
    finally:
        await batcher.stop()
    assert drained_rounds(fake) == [["gpu-1"]]
    assert gate.allowed == 1


async def test_stopping_interrupts_the_drains_waiting_on_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain_batcher, "STORE_RETRY_S", 30.0)
    monkeypatch.setattr(drain_batcher, "STORE_RETRY_MAX_S", 30.0)
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    batcher = DrainBatcher(fake)
    batcher.start()
    waiting = asyncio.ensure_future(batcher.drain("gpu-1", "Xid 79", Gate(failures=1)))
    await asyncio.sleep(0.05)
    await batcher.stop()
    result = await waiting
    assert result.outcome == Outcome.INTERRUPTED and "driven again at start" in result.detail
    assert drained_rounds(fake) == []


# ------------------------------------------------------------------------- through the executor


def fail_breaker_reads(monkeypatch: pytest.MonkeyPatch, executor: Any, times: int) -> list[int]:
    """The breaker window's membership read fails ``times`` times (a dropped connection), then works."""
    real = executor.store.breaker.contains
    failed = [0]

    def contains(*args: Any) -> bool:
        if failed[0] < times:
            failed[0] += 1
            raise StoreError("postgresql://watchd@db/watchd: reading the breaker window: server closed")
        return bool(real(*args))

    monkeypatch.setattr(executor.store.breaker, "contains", contains)
    return failed


async def test_a_breaker_read_failing_mid_round_loses_no_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeScheduler()
    nodes = ["gpu-1", "gpu-2", "gpu-3"]
    fake.add_nodes(nodes)
    executor, audit, _ = make(fake)
    fail_breaker_reads(monkeypatch, executor, times=1)
    rules = rule_engine()
    async with executor:
        for node in nodes:
            for decision in rules.evaluate(xid_event(node, event_id=f"e-{node}")):
                executor.submit(decision, 0.0)
        await executor.drain_in_flight(5)
    drains = sorted((a.node, a.outcome) for a in audit.entries if a.action == "drain")
    assert drains == [(n, "drained") for n in nodes]  # one record each, no "failed"
    assert sorted(n for r in drained_rounds(fake) for n in r) == nodes  # each drained once
    assert executor.store.intents.unfinished() == []
    assert executor.store.breaker.count("all", 0.0) == 3
    metric = executor._metrics.drain_store_failures.labels("retried")._value.get()
    assert metric == 1


async def test_a_drain_interrupted_by_a_long_store_failure_is_driven_again_once_it_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    fake.add_job("7", ["gpu-1"], requeue=True)
    executor, audit, _ = make(fake)
    failed = fail_breaker_reads(monkeypatch, executor, times=4)  # past the bound of 3 retries
    async with executor:
        for decision in rule_engine().evaluate(xid_event("gpu-1")):
            executor.submit(decision, 0.0)
        await executor.drain_in_flight(5)
        assert failed[0] == 4
        assert [i.key for i in executor.store.intents.unfinished()] == ["drain:gpu-1"]  # open, not lost
        assert not fake.nodes["gpu-1"].drained
        assert executor.catch_up() == 1
        await executor.drain_in_flight(5)
        await asyncio.sleep(0.05)
        await executor.drain_in_flight(5)
    got = [(a.action, a.outcome) for a in audit.entries]
    assert got == [
        ("drain", "interrupted"),
        ("requeue", "skipped"),
        ("drain", "drained"),
        ("requeue", "requeued"),  # the requeue its decision had after it
    ], got
    assert "interrupted: it is driven again" in audit.entries[1].detail
    assert executor.store.intents.unfinished() == []
    assert fake.jobs["7"].state == "pending"
    assert executor.store.breaker.count("all", 0.0) == 1
    assert executor._metrics.drain_store_failures.labels("interrupted")._value.get() == 1
