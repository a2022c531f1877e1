import pytest

from tests.support import xid_event
from watchd.adapters.base import SchedulerError
from watchd.adapters.fake import FakeScheduler
from watchd.clock import FakeClock
from watchd.engine.audit import MemoryAudit
from watchd.engine.executor import ActionExecutor, Mode
from watchd.engine.metrics import EngineMetrics
from watchd.rules import load_rules


def make(
    scheduler: FakeScheduler | None, mode: Mode = "enforce"
) -> tuple[ActionExecutor, MemoryAudit, FakeClock]:
    clock = FakeClock()
    audit = MemoryAudit()
    return ActionExecutor(scheduler, mode, clock, EngineMetrics(), audit, cooldown_s=600), audit, clock


def outcomes(audit: MemoryAudit) -> list[tuple[str, str, str]]:
    return [(a.action, a.node, a.outcome) for a in audit.entries]


async def run(executor: ActionExecutor, *events: object) -> None:
    rules = load_rules([]).engine()
    async with executor:
        for event in events:
            for decision in rules.evaluate(event):  # type: ignore[arg-type]
                executor.submit(decision, 0.0)
        await executor.drain_in_flight(5)


async def test_enforce_drains_and_requeues() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2"])
    fake.add_job("10", ["gpu-1", "gpu-2"], requeue=True)
    fake.add_job("11", ["gpu-1"], requeue=False)
    executor, audit, _ = make(fake)
    await run(executor, xid_event("gpu-1"))
    assert outcomes(audit) == [("drain", "gpu-1", "drained"), ("requeue", "gpu-1", "requeued")]
    assert fake.nodes["gpu-1"].reason == "watchd: Xid 79 GPU 0000:3b:00.0 GPU has fallen off the bus"
    assert fake.jobs["10"].state == "pending"
    assert "not requeueable 11" in audit.entries[1].detail
    assert not fake.nodes["gpu-2"].drained


async def test_dry_run_touches_nothing() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    executor, audit, _ = make(fake, "dry-run")
    await run(executor, xid_event("gpu-1"))
    assert outcomes(audit) == [("drain", "gpu-1", "dry_run"), ("requeue", "gpu-1", "dry_run")]
    assert fake.calls == []
    assert "would drain gpu-1: watchd: Xid 79" in audit.entries[0].detail


async def test_admin_drain_is_untouched_and_its_jobs_too() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    fake.add_job("10", ["gpu-1"])
    fake.set_admin_drain("gpu-1", "maintenance: bad fan")
    executor, audit, _ = make(fake)
    await run(executor, xid_event("gpu-1"))
    assert outcomes(audit) == [("drain", "gpu-1", "skipped"), ("requeue", "gpu-1", "skipped")]
    assert fake.nodes["gpu-1"].reason == "maintenance: bad fan"
    assert fake.jobs["10"].state == "running"


async def test_repeat_within_cooldown_is_deduplicated_and_later_allowed() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    executor, audit, clock = make(fake)
    rules = load_rules([]).engine()
    async with executor:
        for eid in ("a", "b"):
            for d in rules.evaluate(xid_event("gpu-1", event_id=eid)):
                executor.submit(d, 0.0)
        await executor.drain_in_flight(5)
        assert [o for *_, o in outcomes(audit)].count("deduplicated") == 2
        assert len(fake.calls_of("drain")) == 1
        clock.advance(601)
        for d in rules.evaluate(xid_event("gpu-1", event_id="c")):
            executor.submit(d, 0.0)
        await executor.drain_in_flight(5)
    assert outcomes(audit)[-2][2] == "already_drained"


async def test_failed_drain_is_reported_and_retried_on_next_event() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    fake.error = SchedulerError("scontrol: exit status 1: Unable to contact slurm controller")
    executor, audit, _ = make(fake)
    rules = load_rules([]).engine()
    async with executor:
        for d in rules.evaluate(xid_event("gpu-1", event_id="a")):
            executor.submit(d, 0.0)
        await executor.drain_in_flight(5)
        assert outcomes(audit)[0][2] == "failed"
        assert "Unable to contact slurm controller" in audit.entries[0].detail
        assert outcomes(audit)[1][2] == "skipped"
        fake.error = None
        for d in rules.evaluate(xid_event("gpu-1", event_id="b")):
            executor.submit(d, 0.0)
        await executor.drain_in_flight(5)
    assert outcomes(audit)[2] == ("drain", "gpu-1", "drained")


async def test_burst_is_coalesced_into_few_scheduler_rounds() -> None:
    fake = FakeScheduler()
    names = [f"sim-{i}" for i in range(150)]
    fake.add_nodes(names)
    executor, _, _ = make(fake)
    await run(executor, *(xid_event(n, event_id=n) for n in names))
    assert all(fake.nodes[n].drained for n in names)
    assert len(fake.calls_of("drain")) <= 3
    assert len(fake.calls_of("update_drain")) <= 3  # one reason: one update per round


async def test_no_scheduler_in_enforce_is_reported() -> None:
    executor, audit, _ = make(None)
    await run(executor, xid_event("gpu-1"))
    assert outcomes(audit)[0] == ("drain", "gpu-1", "no_scheduler")


@pytest.mark.parametrize("code", [13, 31, 43])
async def test_application_xid_is_logged_only(code: int) -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    executor, audit, _ = make(fake)
    await run(executor, xid_event("gpu-1", code))
    assert outcomes(audit) == [("log", "gpu-1", "logged")]
    assert fake.calls == []
