"""The engine's command queue for the agents: a command is handed out at every poll of its node until its
result comes (at least once), withdrawn when never fetched, bounded per node and in all, and reached over
HTTP only with the agents' token (tests/security/test_role_matrix.py has the table)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from watchd.actions.agent_commands import AgentCommands
from watchd.clock import FakeClock
from watchd.model.commands import COMMANDS_PATH, Command, CommandResult, result_path

AGENT = {"node": "gpu-1", "instance": "agent-a"}


def command(n: int = 1, node: str = "gpu-1") -> Command:
    return Command(f"gpu-reset-{n}", node, "gpu_reset", {"gpu": "0000:3b:00.0"}, issued_at=1000.0)


def counted(registry: CollectorRegistry, outcome: str, kind: str = "gpu_reset") -> float:
    labels = {"command": kind, "outcome": outcome}
    return registry.get_sample_value("watchd_agent_commands_total", labels) or 0.0


async def test_handed_out_at_every_poll_until_its_result_comes() -> None:
    registry = CollectorRegistry()
    queue = AgentCommands(FakeClock(), registry)
    waiting = asyncio.ensure_future(queue.run(command(), timeout_s=5))
    await asyncio.sleep(0)
    assert queue.fetch("gpu-2", "agent-a") == []
    handed = [replace(command(), bound_to="agent-a")]
    assert (
        queue.fetch("gpu-1", "agent-a") == handed and queue.fetch("gpu-1", "agent-a") == handed
    )  # at least once
    assert registry.get_sample_value("watchd_agent_commands_pending") == 1
    done = CommandResult("gpu-reset-1", "done", "reset in 3.0 s", {"gpus": ["0000:3b:00.0"]}, 1003.0)
    assert queue.report("gpu-1", "agent-a", done) == (200, "accepted")
    assert await waiting == done
    assert queue.fetch("gpu-1", "agent-a") == [] and counted(registry, "done") == 1
    assert queue.report("gpu-1", "agent-a", done)[0] == 404  # reported twice: not pending any more
    assert registry.get_sample_value("watchd_agent_commands_pending") == 0


async def test_never_fetched_is_withdrawn_and_a_late_result_is_refused() -> None:
    registry = CollectorRegistry()
    queue = AgentCommands(FakeClock(), registry)
    expired = await queue.run(command(), timeout_s=0.01)
    assert expired.outcome == "expired"
    assert "has not asked for commands since the engine started" in expired.detail
    assert queue.fetch("gpu-1", "agent-a") == []  # withdrawn: nothing is run after the engine gave up
    queue.fetch("gpu-2", "agent-a")
    second = await queue.run(command(2, "gpu-2"), timeout_s=0.01)
    assert second.outcome == "expired" and "its agent last asked 0 s ago" in second.detail
    status, _ = queue.report("gpu-1", "agent-a", CommandResult("gpu-reset-1", "done"))
    assert status == 410 and counted(registry, "late") == 1
    assert counted(registry, "expired") == 2


async def test_fetched_and_not_answered() -> None:
    queue = AgentCommands(FakeClock())
    waiting = asyncio.ensure_future(queue.run(command(), timeout_s=0.05))
    await asyncio.sleep(0)
    queue.fetch("gpu-1", "agent-a")
    result = await waiting
    assert result.outcome == "unanswered" and "whether it ran is not known" in result.detail


async def test_bounded_per_node_and_in_all() -> None:
    registry = CollectorRegistry()
    queue = AgentCommands(FakeClock(), registry, max_pending=3, max_per_node=2)
    waits = [asyncio.ensure_future(queue.run(command(n), 5)) for n in (1, 2)]
    await asyncio.sleep(0)
    third = await queue.run(command(3), 5)
    assert third.outcome == "not_queued" and "2 commands pending for gpu-1 (at most 2)" in third.detail
    waits.append(asyncio.ensure_future(queue.run(command(4, "gpu-2"), 5)))
    await asyncio.sleep(0)
    fifth = await queue.run(command(5, "gpu-3"), 5)
    assert fifth.outcome == "not_queued" and "3 commands pending (at most 3)" in fifth.detail
    assert counted(registry, "not_queued") == 2
    for n, node in ((1, "gpu-1"), (2, "gpu-1"), (4, "gpu-2")):
        queue.fetch(node, "agent-a")
        assert (
            queue.report(node, "agent-a", CommandResult(f"gpu-reset-{n}", "failed", "nvidia-smi: exit 3"))[0]
            == 200
        )
    assert [r.outcome for r in await asyncio.gather(*waits)] == ["failed"] * 3


async def test_a_result_for_another_node_is_refused_and_the_same_id_joins_the_wait() -> None:
    queue = AgentCommands(FakeClock())
    first = asyncio.ensure_future(queue.run(command(), 5))
    again = asyncio.ensure_future(queue.run(command(), 5))  # the same id: one command, two waits
    await asyncio.sleep(0)
    assert len(queue.fetch("gpu-1", "agent-a")) == 1
    assert queue.report("gpu-9", "agent-a", CommandResult("gpu-reset-1", "done"))[0] == 409
    assert queue.report("gpu-1", "agent-a", CommandResult("gpu-reset-1", "done"))[0] == 200
    assert (await first).outcome == (await again).outcome == "done"


async def _client(queue: AgentCommands) -> TestClient[Any, Any]:
    app = web.Application()
    queue.routes(app, lambda request: "nobody")
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_the_routes() -> None:
    leading = [True]
    queue = AgentCommands(FakeClock(), leading=lambda: leading[0])
    client = await _client(queue)
    try:
        assert (await client.get(COMMANDS_PATH)).status == 400  # no node
        assert (await client.get(COMMANDS_PATH, params={"node": "gpu-1"})).status == 400  # no instance
        waiting = asyncio.ensure_future(queue.run(command(), 5))
        await asyncio.sleep(0)
        resp = await client.get(COMMANDS_PATH, params=AGENT)
        body = await resp.json()
        assert resp.status == 200 and body["version"] == 1
        [wire] = body["commands"]
        assert Command.from_wire(wire) == replace(command(), bound_to="agent-a")
        bad = await client.post(
            result_path("gpu-reset-1"), params=AGENT, json={"version": 1, "id": "gpu-reset-1"}
        )
        assert bad.status == 400 and "outcome" in (await bad.json())["error"]
        other = CommandResult("gpu-reset-2", "done", finished_at=1.0).to_wire()
        not_the_paths = await client.post(result_path("gpu-reset-1"), params=AGENT, json=other)
        assert not_the_paths.status == 400
        leading[0] = False
        assert (await client.get(COMMANDS_PATH, params=AGENT)).status == 503
        leading[0] = True
        done = CommandResult("gpu-reset-1", "done", "reset", {"gpus": ["0000:3b:00.0"]}, 1.0).to_wire()
        ok = await client.post(result_path("gpu-reset-1"), params=AGENT, json=done)
        assert ok.status == 200 and (await waiting).data == {"gpus": ["0000:3b:00.0"]}
        assert (await client.post(result_path("gpu-reset-1"), params=AGENT, json=done)).status == 404
    finally:
        await client.close()


def refused(registry: CollectorRegistry, reason: str, call: str = "result") -> float:
    labels = {"call": call, "reason": reason}
    return registry.get_sample_value("watchd_agent_command_calls_refused_total", labels) or 0.0


async def test_a_result_needs_its_node_and_the_bound_instance() -> None:
    """A result with no node, for another node, or from an agent run the command is not bound to is refused
    and counted: no token holder records a reset that never happened."""
    registry = CollectorRegistry()
    queue = AgentCommands(FakeClock(), registry)
    client = await _client(queue)
    try:
        waiting = asyncio.ensure_future(queue.run(command(), 5))
        await asyncio.sleep(0)
        assert (await client.get(COMMANDS_PATH, params=AGENT)).status == 200  # bound to agent-a
        done = CommandResult("gpu-reset-1", "done", "reset", {"gpus": ["0000:3b:00.0"]}, 1.0).to_wire()
        path = result_path("gpu-reset-1")
        no_node = await client.post(path, params={"instance": "agent-a"}, json=done)
        assert no_node.status == 400 and "node" in (await no_node.json())["error"]
        other_node = await client.post(path, params={"node": "gpu-2", "instance": "agent-a"}, json=done)
        assert other_node.status == 409 and "is for gpu-1, not gpu-2" in (await other_node.json())["error"]
        no_instance = await client.post(path, params={"node": "gpu-1"}, json=done)
        assert no_instance.status == 400
        other_run = await client.post(path, params={"node": "gpu-1", "instance": "agent-b"}, json=done)
        assert (
            other_run.status == 409
            and "bound to the agent instance agent-a, not agent-b" in (await other_run.json())["error"]
        )
        assert not waiting.done(), "nothing of these was taken"
        assert [refused(registry, r) for r in ("no_node", "other_node", "no_instance", "other_instance")] == [
            1,
            1,
            1,
            1,
        ]
        assert (await client.post(path, params=AGENT, json=done)).status == 200
        assert (await waiting).outcome == "done"
    finally:
        await client.close()


async def test_a_later_run_of_the_agent_may_only_say_it_did_not_run_it() -> None:
    queue = AgentCommands(FakeClock())
    waiting = asyncio.ensure_future(queue.run(command(), 5))
    await asyncio.sleep(0)
    assert [c.bound_to for c in queue.fetch("gpu-1", "agent-a")] == ["agent-a"]
    assert [c.bound_to for c in queue.fetch("gpu-1", "agent-b")] == ["agent-a"], "bound to the first"
    said = CommandResult("gpu-reset-1", "refused", "fetched by an earlier run of this agent: not run")
    assert queue.report("gpu-1", "agent-b", said) == (200, "accepted")
    result = await waiting
    assert result.outcome == "unanswered" and "whether agent-a ran it is not known" in result.detail
    assert "fetched by the agent instance agent-a, whose result never came" in result.detail
