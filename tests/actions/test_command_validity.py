"""A command is valid only while its reason holds: a GPU reset queued for a node watchd drained is withdrawn,
never handed out, when its agent asks after the node was resumed (by an operator, or Slurm put a job on it),
drained again by watchd since, or marked; it is kept back, not handed out and not withdrawn, while the
scheduler cannot say; and a node inside watchd's validation (its drain lifted into a maintenance
reservation) still counts as out of service."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

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


async def _client(queue: AgentCommands) -> TestClient[Any, Any]:
    app = web.Application()
    queue.routes(app, lambda request: "nobody")
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


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


async def test_a_node_resumed_before_its_agent_asks_is_never_reset() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, queue, reset = await _queued_reset(fake)
    client = await _client(queue)
    try:
        fake.add_node("gpu-1", state="allocated")  # an operator resumed it, and Slurm put a job there
        assert await _poll(client) == []
        result = await asyncio.wait_for(reset, 5)
    finally:
        await client.close()
        await executor.__aexit__(None, None, None)
    assert result.outcome == "withdrawn", result
    assert (
        "no longer out of service by watchd (ALLOCATED)" in result.detail
        and "nothing was run" in result.detail
    )
    assert executor.store.nodes.remediations("gpu-1", 0.0) == 0  # nothing done: not counted


async def test_a_job_on_a_drained_node_withdraws_the_command() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, queue, reset = await _queued_reset(fake)
    client = await _client(queue)
    try:
        drained(
            fake, state="mixed"
        )  # still drained, but a job landed (a reservation, a start before the drain)
        assert await _poll(client) == []
        result = await asyncio.wait_for(reset, 5)
    finally:
        await client.close()
        await executor.__aexit__(None, None, None)
    assert result.outcome == "withdrawn" and "a job was put on it (MIXED+DRAIN)" in result.detail


async def test_a_node_drained_again_by_watchd_since_withdraws_the_older_command() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, queue, reset = await _queued_reset(fake)
    client = await _client(queue)
    try:
        fake.add_node("gpu-1")  # resumed by hand...
        assert (
            await executor.act("drain", "gpu-1", {"reason": "Xid 95 again"}, rule="xid")
        ).outcome == "drained"
        assert await _poll(client) == []  # ...and drained again by watchd: a new decision answers it
        result = await asyncio.wait_for(reset, 5)
    finally:
        await client.close()
        await executor.__aexit__(None, None, None)
    assert result.outcome == "withdrawn" and "drained again by watchd since (drain 0 -> 1)" in result.detail


async def test_a_node_marked_while_its_command_waits_is_not_reset() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, queue, reset = await _queued_reset(fake)
    client = await _client(queue)
    try:
        executor.store.nodes.mark("gpu-1", "lemon", "lemon-node", "lemon, RMA suspected", 1.0)
        assert await _poll(client) == []
        result = await asyncio.wait_for(reset, 5)
    finally:
        await client.close()
        await executor.__aexit__(None, None, None)
    assert result.outcome == "withdrawn" and "marked a lemon by rule lemon-node" in result.detail


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
