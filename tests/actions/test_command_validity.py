"""A command is valid only while its reason holds: a GPU reset queued for a node watchd drained is withdrawn,
never handed out, when its agent asks after the node was resumed (by an operator, or Slurm put a job on it),
drained again by watchd since, or marked; it is kept back, not handed out and not withdrawn, while the
scheduler cannot say; and a node inside watchd's validation (its drain lifted into a maintenance
reservation) still counts as out of service."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.actions.test_command_queue import _client
from tests.actions.test_executor import make
from tests.actions.test_gpu_reset_action import drained
from tests.actions.test_reboot_action import Checks
from tests.support import eventually
from watchd.actions.agent_commands import AgentCommands
from watchd.actions.executor import ActionExecutor
from watchd.integrations.base import SchedulerError
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.commands import COMMANDS_PATH, Command
from watchd.model.nodes import NodeState

AGENT = {"node": "gpu-1", "instance": "agent-a"}
LEMON = {"reason": "lemon, RMA suspected", "replace_reason": True}


async def _poll(client: TestClient[Any, Any]) -> list[Command]:
    resp = await client.get(COMMANDS_PATH, params=AGENT)
    assert resp.status == 200, await resp.text()
    return [Command.from_wire(c) for c in (await resp.json())["commands"]]


async def _queued_reset(fake: FakeScheduler) -> tuple[ActionExecutor, AgentCommands, asyncio.Future[Any]]:
    executor, _, clock = make(fake)
    queue = AgentCommands(clock)
    executor.attach(validation=Checks(), commands=queue)
    await executor.__aenter__()
    reset = asyncio.ensure_future(executor.act("gpu_reset", "gpu-1", {"timeout": 30}, rule="xid-gpu-reset"))
    await eventually(lambda: bool(queue.status()["pending"]), what="the reset queued")
    return executor, queue, reset


async def resumed_with_a_job(fake: FakeScheduler, executor: ActionExecutor) -> None:
    fake.add_node("gpu-1", state="allocated")  # an operator resumed it, and Slurm put a job there


async def a_job_on_the_drained_node(fake: FakeScheduler, executor: ActionExecutor) -> None:
    drained(fake, state="mixed")  # still drained, but a job landed (a reservation, a start before the drain)


async def drained_again_by_watchd(fake: FakeScheduler, executor: ActionExecutor) -> None:
    fake.add_node("gpu-1")  # resumed by hand, then drained again by watchd: a new decision answers it
    assert (await executor.act("drain", "gpu-1", {"reason": "Xid 95 again"}, rule="xid")).outcome == "drained"


async def marked(fake: FakeScheduler, executor: ActionExecutor) -> None:
    executor.store.nodes.mark("gpu-1", "lemon", "lemon-node", "lemon, RMA suspected", 1.0)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (resumed_with_a_job, "no longer out of service by watchd (ALLOCATED)"),
        (a_job_on_the_drained_node, "a job was put on it (MIXED+DRAIN)"),
        (drained_again_by_watchd, "drained again by watchd since (drain 0 -> 1)"),
        (marked, "marked a lemon by rule lemon-node"),
    ],
)
async def test_a_reset_whose_reason_no_longer_holds_when_its_agent_asks_is_withdrawn(
    change: Callable[[FakeScheduler, ActionExecutor], Awaitable[None]], why: str
) -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, queue, reset = await _queued_reset(fake)
    client = await _client(queue)
    try:
        await change(fake, executor)
        assert await _poll(client) == []  # never handed out
        result = await asyncio.wait_for(reset, 5)
    finally:
        await client.close()
        await executor.__aexit__(None, None, None)
    assert result.outcome == "withdrawn", result
    assert why in result.detail and "nothing was run" in result.detail, result.detail
    assert executor.store.nodes.remediations("gpu-1", 0.0) == 0  # nothing done: not counted


class Unreachable(FakeScheduler):
    down = False

    async def node_states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        if self.down:
            raise SchedulerError("scontrol: timed out")
        return await super().node_states(nodes)


async def test_kept_back_while_the_scheduler_cannot_say_then_handed_out() -> None:
    fake = Unreachable()
    drained(fake)
    executor, queue, reset = await _queued_reset(fake)
    client = await _client(queue)
    try:
        fake.down = True
        assert await _poll(client) == []  # not handed out, not withdrawn
        assert not reset.done() and queue.status()["pending"]
        fake.down = False
        [handed] = await _poll(client)
        assert handed.bound_to == "agent-a" and handed.args["drain_generation"] == "0"
    finally:
        reset.cancel()
        await client.close()
        await executor.__aexit__(None, None, None)


async def test_inside_watchds_validation_reservation_it_still_counts_as_out_of_service() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, queue, reset = await _queued_reset(fake)
    client = await _client(queue)
    try:
        fake.add_node("gpu-1", flags={"MAINT"})  # the drain lifted into the maintenance reservation
        [handed] = await _poll(client)
        assert handed.kind == "gpu_reset"
    finally:
        reset.cancel()
        await client.close()
        await executor.__aexit__(None, None, None)
