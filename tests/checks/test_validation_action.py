"""Validation is an action (``validate``) through the executor's pipeline: a follower makes no change to the
cluster, a leader deposed mid-check leaves the intent open and never finishes the validation, and the engine
that leads then (or the same one after a restart) finishes it or puts the drain back: a node is never in
service without a pass. Fake scheduler and fake runner sharing one view of the nodes (the real cluster:
tests/checks/test_validation_kill9.py)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from tests.support import ScriptedLease
from watchd.actions.audit import MemoryAudit
from watchd.actions.executor import ActionExecutor
from watchd.checks.metrics import CheckMetrics
from watchd.checks.params import ChecksConfig
from watchd.checks.runner import CheckJob, RunOutput
from watchd.checks.service import CheckService
from watchd.clock import FakeClock
from watchd.engine.metrics import EngineMetrics
from watchd.integrations.fake.checks import FakeCheckRunner, FakeNode
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.integrations.leadership import AlwaysLeader, Leadership
from watchd.model.events import Event
from watchd.store.database import Store

NODE = "gpu-1"
EVIDENCE = "nccl busbw 312 GB/s < 80% of 450 GB/s"


class Cluster(FakeCheckRunner):
    """The fake runner acting on the fake scheduler's nodes, as Slurm's runner acts on Slurm's: begin lifts
    the drain inside a reservation, end resumes or drains again; every change is recorded."""

    def __init__(self, scheduler: FakeScheduler, script: Callable[[CheckJob], RunOutput]) -> None:
        super().__init__([FakeNode(NODE, ("gpu",))], script)
        self.scheduler = scheduler
        self.changes: list[str] = []

    async def begin_validation(self, node: str, time_limit_s: float) -> None:
        self.changes.append("begin")
        await super().begin_validation(node, time_limit_s)
        await self.scheduler.resume(node)

    async def end_validation(self, node: str, passed: bool, reason: str) -> str:
        self.changes.append(f"end passed={passed}")
        done = await super().end_validation(node, passed, reason)
        if not passed:
            await self.scheduler.drain({node: reason})
        return done

    async def abandon_validation(self, node: str) -> None:
        self.changes.append("abandon")
        await super().abandon_validation(node)

    async def submit(self, job: CheckJob) -> object:  # type: ignore[override]
        self.changes.append(f"submit {job.check}")
        return await super().submit(job)


def passing(job: CheckJob) -> RunOutput:
    return RunOutput("completed", "", 0)


def checks() -> ChecksConfig:
    item = {"type": "command", "command": ["/bin/true"], "time_limit": 60}
    return ChecksConfig.model_validate(
        {
            "enabled": True,
            "runner": "fake",
            "items": [{"name": "nhc", **item}, {"name": "burn", **item}],
        }
    )


def engine(
    store: Store, scheduler: FakeScheduler, runner: Cluster, leadership: Leadership
) -> tuple[ActionExecutor, MemoryAudit, CheckService]:
    clock = FakeClock()
    audit = MemoryAudit()
    executor = ActionExecutor(
        scheduler, "enforce", clock, EngineMetrics(), audit, store=store, leadership=leadership
    )

    async def emit(event: Event) -> None:
        return None

    service = CheckService(checks(), runner, store, clock, emit, CheckMetrics(CollectorRegistry()))
    service.gate(executor.leader_gate.now)
    executor.attach(validation=service)
    return executor, audit, service


def drained_cluster(script: Callable[[CheckJob], RunOutput] = passing) -> tuple[FakeScheduler, Cluster]:
    scheduler = FakeScheduler()
    scheduler.add_node(NODE, flags={"DRAIN"}, reason=f"watchd: {EVIDENCE}")
    runner = Cluster(scheduler, script)
    runner.nodes[NODE].flags.add("DRAIN")
    return scheduler, runner


async def validate(executor: ActionExecutor, round_id: str = "validate:t1") -> tuple[str, str]:
    result = await executor.act(
        "validate", NODE, {"round": round_id}, rule="validate", note="by alice", mode="enforce"
    )
    return result.outcome.value, result.detail


async def test_a_follower_changes_nothing() -> None:
    scheduler, runner = drained_cluster()
    executor, audit, _ = engine(Store.open(":memory:"), scheduler, runner, ScriptedLease(False, 0))
    async with executor:
        outcome, detail = await validate(executor)
    assert outcome == "failed" and "not the leader" in detail
    assert runner.changes == [] and scheduler.nodes[NODE].drained
    [record] = audit.entries
    assert (record.action, record.outcome, record.rule) == ("validate", "failed", "validate")


async def test_a_leader_deposed_mid_check_leaves_it_to_the_next_leader() -> None:
    store = Store.open(":memory:")
    scheduler, runner = drained_cluster()
    # the stage, the reservation and the first check's job are confirmed; then the lease is taken
    executor, _, _ = engine(store, scheduler, runner, ScriptedLease(True, 3))
    async with executor:
        outcome, detail = await validate(executor)
    assert outcome == "interrupted" and "not the leader" in detail
    assert runner.changes == ["begin", "submit nhc"]  # the second check and the end were refused
    assert not scheduler.nodes[NODE].drained and runner.nodes[NODE].reserved  # mid-way: in its reservation
    [intent] = store.intents.unfinished()  # open, for whoever leads
    assert intent.kind == "validate"
    # the engine that took the lease finds it and puts the drain back (not every check passed)
    runner.changes.clear()
    executor2, audit2, _ = engine(store, scheduler, runner, AlwaysLeader())
    executor2.recover_at_start = False
    async with executor2:
        await executor2.take_over()
        await executor2.drain_in_flight(5)
    assert runner.changes == ["end passed=False"]
    assert scheduler.nodes[NODE].drained and not runner.nodes[NODE].reserved
    assert "validate interrupted: an engine restart" in str(scheduler.nodes[NODE].reason)
    assert store.intents.unfinished() == []
    [record] = audit2.entries
    assert (record.action, record.outcome) == ("validate", "drained")
    assert record.detail.startswith("re-driven after a restart")


async def test_a_restart_after_every_check_passed_finishes_it() -> None:
    store = Store.open(":memory:")
    scheduler, runner = drained_cluster()
    # everything confirmed up to the end, which is refused: the checks all passed
    executor, _, _ = engine(store, scheduler, runner, ScriptedLease(True, 4))
    async with executor:
        outcome, _ = await validate(executor)
    assert outcome == "interrupted" and runner.changes == ["begin", "submit nhc", "submit burn"]
    runner.changes.clear()
    executor2, audit2, _ = engine(store, scheduler, runner, AlwaysLeader())
    async with executor2:  # a restart: recovery at start
        await executor2.drain_in_flight(5)
    assert runner.changes == ["end passed=True"]
    assert not scheduler.nodes[NODE].drained and not runner.nodes[NODE].reserved
    [record] = audit2.entries
    assert (record.action, record.outcome) == ("validate", "resumed")
    assert [r["outcome"] for r in record.result["results"]] == ["passed", "passed"]


async def test_a_restart_before_the_drain_was_lifted_leaves_it_drained_as_it_was() -> None:
    store = Store.open(":memory:")
    scheduler, runner = drained_cluster()
    executor, _, _ = engine(store, scheduler, runner, ScriptedLease(True, 1))  # the stage only: begin refused
    async with executor:
        outcome, _ = await validate(executor)
    assert outcome == "failed" and runner.changes == [] and store.intents.unfinished() == []
    # an intent left open by a kill -9 before the reservation (written, nothing done)
    store = Store.open(":memory:")
    store.intents.begin("validate:gpu-1", "validate", NODE, "validate", "e1", {"round": "validate:t9"}, 1.0)
    store.intents.forget("validate:gpu-1")
    executor2, audit2, _ = engine(store, scheduler, runner, AlwaysLeader())
    async with executor2:
        await executor2.drain_in_flight(5)
    assert runner.changes == ["abandon"]
    assert scheduler.nodes[NODE].reason == f"watchd: {EVIDENCE}"  # the evidence as it was
    assert [(a.action, a.outcome) for a in audit2.entries] == [("validate", "drained")]


async def test_a_second_validation_while_one_runs_is_refused_not_run() -> None:
    scheduler, runner = drained_cluster()
    executor, _, _ = engine(Store.open(":memory:"), scheduler, runner, AlwaysLeader())
    runner.delay_s = 0.2
    async with executor:
        import asyncio

        first = asyncio.ensure_future(validate(executor, "validate:a"))
        await asyncio.sleep(0.05)
        second = await validate(executor, "validate:b")
        assert second[0] == "deduplicated" and "in progress" in second[1]
        assert (await first)[0] == "resumed"
    assert runner.changes.count("begin") == 1
