"""The agent's side of the command path, over real HTTP against the engine's command queue: a GPU held by a
process is refused, a free one reset (with the fake's real delay) and reported with the GPUs enumerated after;
a command asked again (the engine restarted and drove its action again) is answered from memory, across an
agent restart too (the state file); a command begun by an agent that died is never run again. At most once,
really: nothing runs without a durable record that it runs (no state file, a full disk, a folder gone), a
command bound to an earlier run of the agent that the memory does not cover (deleted, corrupt, empty) is
refused, and no id is forgotten because newer ones came."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from watchd.actions.agent_commands import AgentCommands
from watchd.agent.command_memory import CommandMemory
from watchd.agent.commands import CommandRunner
from watchd.agent.gpu_reset import gpu_reset_executor
from watchd.agent.metrics import AgentMetrics
from watchd.clock import SystemClock
from watchd.gpu.sampler import GpuSampler
from watchd.model.commands import Command
from watchd.sim.gpu import FakeGpuBackend
from watchd.sim.gpu_reset import FakeGpuResetter, for_backend
from watchd.sim.scenario import Scenario, XidFault
from watchd.store.database import Store


class Engine:
    """The engine's command queue on a real HTTP server."""

    def __init__(self, store: Store | None = None) -> None:
        bindings = store.command_bindings if store is not None else None
        self.queue = AgentCommands(SystemClock(), bindings=bindings)
        app = web.Application()
        self.queue.routes(app, lambda request: "nobody")
        self.server = TestServer(app)

    async def __aenter__(self) -> Engine:
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()

    @property
    def url(self) -> str:
        return str(self.server.make_url(""))


def runner(engine: Engine, fake: FakeGpuResetter, memory: CommandMemory, **kw: Any) -> CommandRunner:
    metrics = kw.pop("metrics", None) or AgentMetrics()
    executors = {"gpu_reset": gpu_reset_executor(fake, kw.pop("sampler", None))}
    return CommandRunner("gpu-1", engine.url, None, metrics, executors, poll_s=0.05, memory=memory, **kw)


def command(n: int = 1, gpu: str = "0000:2a:00.0", issued_at: float | None = None) -> Command:
    at = time.time() if issued_at is None else issued_at
    return Command(f"gpu-reset-{n}", "gpu-1", "gpu_reset", {"gpu": gpu}, issued_at=at)


async def test_a_held_gpu_is_refused_and_a_free_one_reset_and_reported(tmp_path: Path) -> None:
    training = FakeGpuBackend(Scenario.training(gpus=2), time.time())
    metrics = AgentMetrics()
    async with Engine() as engine:
        memory = CommandMemory(tmp_path / "commands.json")
        agent = asyncio.ensure_future(
            runner(engine, for_backend(training, 0.0), memory, metrics=metrics).run()
        )
        refused = await engine.queue.run(command(1), timeout_s=10)
        assert refused.outcome == "refused", refused
        assert (
            "in use: pid" in refused.detail and "(python3) on GPU 0000:2a:00.0: not reset" in refused.detail
        )
        agent.cancel()

        idle = FakeGpuBackend(Scenario.idle(gpus=2, faults=[XidFault(at=0, gpu=1, code=95)]), time.time())
        fake = for_backend(idle, delay_s=0.5)
        sampler = GpuSampler(idle, "gpu-1", lambda e: None, interval_s=0.05)
        sampling = asyncio.ensure_future(sampler.run())
        agent = asyncio.ensure_future(runner(engine, fake, memory, sampler=sampler, metrics=metrics).run())
        started = time.monotonic()
        done = await engine.queue.run(command(2), timeout_s=10)
        took = time.monotonic() - started
        agent.cancel()
        sampling.cancel()
        await asyncio.gather(agent, sampling, return_exceptions=True)
    assert done.outcome == "done", done
    assert took >= 0.5, "the fake costs what a reset costs"
    assert done.data["gpus"] == ["0000:2a:00.0"] and done.data["seconds"] >= 0.5
    assert [g["pci_bus_id"] for g in done.data["after"]] == ["0000:18:00.0", "0000:2a:00.0"]
    assert fake.resets == [("0000:2a:00.0",)] and idle._faults_of(1) == []  # the Xid's fault is over
    run_total = metrics.registry.get_sample_value
    assert run_total("watchd_agent_commands_run_total", {"command": "gpu_reset", "outcome": "done"}) == 1
    assert run_total("watchd_agent_commands_run_total", {"command": "gpu_reset", "outcome": "refused"}) == 1


async def test_asked_again_it_answers_from_memory_across_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "commands.json"
    backend = FakeGpuBackend(Scenario.idle(gpus=2), time.time())
    fake = for_backend(backend, delay_s=0.0)
    async with Engine() as engine:
        first = runner(engine, fake, CommandMemory(state))
        agent = asyncio.ensure_future(first.run())
        done = await engine.queue.run(command(), timeout_s=10)
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
        assert done.outcome == "done" and len(fake.resets) == 1
        # the engine restarted and drives its action again: the same id; the agent restarted too
        restarted = runner(engine, fake, CommandMemory(state))
        agent = asyncio.ensure_future(restarted.run())
        again = await engine.queue.run(command(), timeout_s=10)
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
    assert again == done, "the same result, from memory"
    assert len(fake.resets) == 1, "never reset twice"
    assert json.loads(state.read_text())["commands"]["gpu-reset-1"]["state"] == "ended"


async def test_a_command_begun_by_an_agent_that_died_is_never_run_again(tmp_path: Path) -> None:
    state = tmp_path / "commands.json"
    memory = CommandMemory(state)
    memory.record("gpu-reset-1", {"state": "running", "kind": "gpu_reset"})
    fake = for_backend(FakeGpuBackend(Scenario.idle(gpus=2), time.time()), delay_s=0.0)
    async with Engine() as engine:
        agent = asyncio.ensure_future(runner(engine, fake, CommandMemory(state)).run())
        result = await engine.queue.run(command(), timeout_s=10)
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
    assert (
        result.outcome == "failed" and "restarted while it ran this command: not run again" in result.detail
    )
    assert fake.resets == []


async def test_an_engine_without_the_command_path_is_said_once() -> None:
    app = web.Application()  # an older engine: 404 for the command path
    server = TestServer(app)
    await server.start_server()
    metrics = AgentMetrics()
    fake = for_backend(FakeGpuBackend(Scenario.idle(gpus=1), time.time()), 0.0)
    agent = CommandRunner("gpu-1", str(server.make_url("")), None, metrics, {}, poll_s=0.01)
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            assert await agent.poll_once(session) == 0
    await server.close()
    polls = metrics.registry.get_sample_value("watchd_agent_command_polls_total", {"result": "unsupported"})
    assert polls == 3 and fake.resets == []
