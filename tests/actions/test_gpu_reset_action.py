"""The gpu_reset action through the executor over the fake scheduler and the engine's command queue, with a
stand-in agent answering over the queue: asked once the node runs no job, refused for a node watchd did not
drain, left for a person when the agent refuses or fails, counted with reboots in the remediation limit, and
asked with the same command id when it is driven again after a crash (the agent then answers from memory)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.actions.test_executor import make
from tests.actions.test_reboot_action import Checks
from tests.support import eventually
from watchd.actions import handlers
from watchd.actions.agent_commands import AgentCommands
from watchd.actions.handlers import gpu_reset
from watchd.clock import FakeClock
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.commands import Command, CommandResult
from watchd.store.database import Store

Answer = Callable[[Command], CommandResult | None]


def done(command: Command) -> CommandResult:
    gpu = command.args["gpu"]
    return CommandResult(command.id, "done", f"{gpu} reset in 3.1 s", {"gpus": [gpu], "seconds": 3.1}, 1.0)


class Agent:
    """An agent polling the queue: runs each command id once (``answer`` says how it ended; None: it never
    reports) and answers a command asked again from memory."""

    def __init__(self, queue: AgentCommands, node: str = "gpu-1", answer: Answer = done) -> None:
        self.queue, self.node, self.answer = queue, node, answer
        self.ran: list[Command] = []
        self.remembered: dict[str, CommandResult | None] = {}
        self._task = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        while True:
            for command in self.queue.fetch(self.node, "agent-a"):
                if command.id not in self.remembered:
                    self.ran.append(command)
                    self.remembered[command.id] = self.answer(command)
                result = self.remembered[command.id]
                if result is not None:
                    self.queue.report(self.node, "agent-a", result)
            await asyncio.sleep(0.005)

    def stop(self) -> None:
        self._task.cancel()


def drained(fake: FakeScheduler, node: str = "gpu-1", state: str = "idle") -> None:
    fake.add_node(node, state=state, flags={"DRAIN"}, reason="watchd: Xid 95 GPU 0000:3b:00.0")


def test_the_handler_is_in_the_table() -> None:
    assert handlers.handler_for("gpu_reset") is gpu_reset.HANDLER
    assert gpu_reset.HANDLER.disruptive and gpu_reset.HANDLER.follows_drain


async def test_an_idle_drained_node_is_reset_through_its_agent() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, audit, clock = make(fake)
    queue = AgentCommands(clock)
    executor.attach(validation=Checks(), commands=queue)
    agent = Agent(queue)
    async with executor:
        result = await executor.act("gpu_reset", "gpu-1", {"gpu": "PCI:0000:3B:00"}, rule="xid-gpu-reset")
    agent.stop()
    assert result.outcome == "reset", result
    assert "0000:3b:00.0 of gpu-1 reset by its agent: 0000:3b:00.0 reset in 3.1 s" in result.detail
    [ran] = agent.ran
    assert ran.args == {"gpu": "0000:3b:00.0", "drain_generation": "0"} and ran.id.startswith("gpu-reset-")
    assert result.data["command"] == ran.id and result.data["gpus"] == ["0000:3b:00.0"]
    [record] = audit.entries
    assert (record.action, record.outcome) == ("gpu_reset", "reset")
    assert fake.nodes["gpu-1"].drained, "still out of service: validation returns it"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (
            lambda c: CommandResult(c.id, "refused", "in use: pid 4242 (python3) on GPU 0000:3b:00.0"),
            "the agent refused the reset of 0000:3b:00.0: in use: pid 4242",
        ),
        (
            lambda c: CommandResult(c.id, "failed", "nvidia-smi --gpu-reset: exit status 255"),
            "the agent failed the reset of 0000:3b:00.0: nvidia-smi --gpu-reset: exit status 255",
        ),
    ],
)
async def test_a_refused_or_failed_reset_is_not_reset_and_the_rules_decide(answer: Answer, why: str) -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, _, clock = make(fake)
    queue = AgentCommands(clock)
    executor.attach(validation=Checks(), commands=queue)
    agent = Agent(queue, answer=answer)
    async with executor:
        result = await executor.act("gpu_reset", "gpu-1", {"gpu": "0000:3b:00.0"}, rule="xid-gpu-reset")
    agent.stop()
    assert result.outcome == "not_reset" and why in result.detail, result
    assert fake.nodes["gpu-1"].drained


async def test_an_agent_that_never_asks_is_not_reset() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, _, clock = make(fake)
    executor.attach(validation=Checks(), commands=AgentCommands(clock))
    async with executor:
        result = await executor.act("gpu_reset", "gpu-1", {"timeout": 0.05}, rule="xid-gpu-reset")
    assert result.outcome == "not_reset", result
    assert "no GPU reset: not fetched" in result.detail and "has not asked for commands" in result.detail


async def test_refused_without_checks_for_someone_elses_drain_and_in_service() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    fake.set_admin_drain("gpu-2", "admin: PSU")
    drained(fake, "gpu-3")
    executor, _, clock = make(fake)
    queue = AgentCommands(clock)
    executor.attach(commands=queue)
    agents = [Agent(queue, node) for node in ("gpu-1", "gpu-2", "gpu-3")]
    async with executor:
        assert (await executor.act("gpu_reset", "gpu-3", {}, rule="x")).outcome == "no_checks"
        executor.attach(validation=Checks())
        assert (await executor.act("gpu_reset", "gpu-2", {}, rule="x")).outcome == "refused"
        assert (await executor.act("gpu_reset", "gpu-1", {}, rule="x")).outcome == "not_drained"
        bad = await executor.act("gpu_reset", "gpu-3", {"gpu": "GPU 3"}, rule="x")
        assert bad.outcome == "failed" and "not a PCI bus id" in bad.detail
    for agent in agents:
        agent.stop()
        assert agent.ran == []


async def test_it_waits_for_the_jobs_to_end_and_leaves_a_node_that_keeps_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_reset, "IDLE_POLL_S", 0.01)
    fake = FakeScheduler()
    drained(fake, state="mixed")
    drained(fake, "gpu-2", state="allocated")
    executor, _, clock = make(fake)
    queue = AgentCommands(clock)
    executor.attach(validation=Checks(), commands=queue)
    agents = [Agent(queue), Agent(queue, "gpu-2")]

    async def job_ends() -> None:
        await asyncio.sleep(0.05)
        ending = frozenset({"DRAIN", "COMPLETING"})
        fake.nodes["gpu-1"] = replace(fake.nodes["gpu-1"], state="idle", flags=ending)
        await asyncio.sleep(0.05)
        fake.nodes["gpu-1"] = replace(fake.nodes["gpu-1"], flags=frozenset({"DRAIN"}))

    async with executor:
        ending = asyncio.ensure_future(job_ends())
        first = await executor.act("gpu_reset", "gpu-1", {}, rule="x")
        kept = await executor.act("gpu_reset", "gpu-2", {"wait_idle": 0.1}, rule="x")
        await ending
    for agent in agents:
        agent.stop()
    assert first.outcome == "reset" and len(agents[0].ran) == 1
    assert first.data["gpus"] == [""]  # every GPU of the node
    assert kept.outcome == "left_for_a_person" and "still runs a job" in kept.detail
    assert "ALLOCATED+DRAIN" in kept.detail and agents[1].ran == []


async def test_resets_and_reboots_count_together_in_the_limit() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, _, clock = make(fake)
    queue = AgentCommands(clock)
    executor.attach(validation=Checks(), commands=queue)
    agent = Agent(queue)
    async with executor:
        assert (await executor.act("reboot", "gpu-1", {}, rule="xid")).outcome == "rebooting"
        fake.complete_reboot("gpu-1", "boot-2")
        for _ in range(2):
            drained(fake)
            clock.advance(3600)
            assert (await executor.act("gpu_reset", "gpu-1", {}, rule="xid")).outcome == "reset"
        clock.advance(3600)
        fourth = await executor.act("gpu_reset", "gpu-1", {"max_per_node": 3}, rule="xid")
        assert fourth.outcome == "left_for_a_person" and "3 automatic remediations in 7 d" in fourth.detail
        again = await executor.act("reboot", "gpu-1", {}, rule="xid")
        assert again.outcome == "left_for_a_person"
    agent.stop()
    assert len(agent.ran) == 2


async def test_dry_run_describes_and_asks_nothing() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, _, clock = make(fake, mode="dry-run")
    queue = AgentCommands(clock)
    executor.attach(validation=Checks(), commands=queue)
    agent = Agent(queue)
    async with executor:
        result = await executor.act("gpu_reset", "gpu-1", {"gpu": "0000:3b:00.0"}, rule="xid")
    agent.stop()
    assert result.outcome == "dry_run"
    assert "would reset 0000:3b:00.0 of gpu-1 through its agent" in result.detail
    assert agent.ran == []


async def test_driven_again_after_a_crash_it_asks_with_the_same_id_and_resets_once(tmp_path: Path) -> None:
    """The engine dies while the agent runs the reset (the agent fetched the command, its result never
    arrived); the restarted engine drives the open intent again with the same command id; the agent, which
    ran that id, answers from memory: one reset, audited once as done."""
    db = tmp_path / "state.db"
    fake = FakeScheduler()
    drained(fake)
    clock = FakeClock()
    first_queue = AgentCommands(clock)
    executor, _, _ = make(fake, store=Store.open(db), clock=clock)
    executor.attach(validation=Checks(), commands=first_queue)
    crashed_agent = Agent(first_queue, answer=lambda c: None)  # runs it; the engine dies before the result
    async with executor:
        acting = asyncio.ensure_future(executor.act("gpu_reset", "gpu-1", {}, rule="xid-gpu-reset"))
        await eventually(lambda: bool(crashed_agent.ran), 10, "the agent ran the reset")
        acting.cancel()  # the engine stops mid-way: the intent stays open
        await asyncio.gather(acting, return_exceptions=True)
    crashed_agent.stop()
    executor.store.close()

    queue = AgentCommands(clock)
    executor, audit, _ = make(fake, store=Store.open(db), clock=clock)
    executor.attach(validation=Checks(), commands=queue)
    agent = Agent(queue)
    agent.remembered = {c.id: done(c) for c in crashed_agent.ran}  # what the agent ran before
    async with executor:
        await eventually(lambda: bool(audit.entries), 10, "the re-driven reset audited")
    agent.stop()
    executor.store.close()
    [record] = audit.entries
    assert (record.action, record.outcome) == ("gpu_reset", "reset"), record
    assert "re-driven after a restart" in record.detail
    assert record.result["command"] == crashed_agent.ran[0].id
    assert agent.ran == [], "never run twice"
