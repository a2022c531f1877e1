"""The agent runs a command id at most once, really: over real HTTP against the engine's command queue on a
real state database (its bindings), with the fake resetter counting resets.

- an engine restarted (its queue gone, its store kept) and an agent restarted with its state file deleted,
  corrupt or empty: the command is bound to the earlier run of the agent, which may have run it; the new run
  refuses it, and the GPU is reset once;
- no durable record, no run: no state file, a full disk (fsync fails), the folder gone;
- no id forgotten because newer ones came; the memory bounded by time, full means refused;
- the file written by root: a folder others can write is refused at start, a symlink is neither followed
  when read nor when the temporary file is written;
- an engine that binds nothing (older): refused; ``issued_at`` against this host's clock: never compared."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_agent_commands import Engine, command, runner
from watchd.agent import command_memory
from watchd.agent.command_memory import KEEP_S, MAX_REMEMBERED, CommandMemory, Unrecorded
from watchd.agent.metrics import AgentMetrics
from watchd.errors import ConfigError
from watchd.model.commands import CommandResult
from watchd.sim.gpu import FakeGpuBackend
from watchd.sim.gpu_reset import FakeGpuResetter, for_backend
from watchd.sim.scenario import Scenario
from watchd.store.database import Store


def _fake() -> FakeGpuResetter:
    return for_backend(FakeGpuBackend(Scenario.idle(gpus=2), time.time()), delay_s=0.0)


async def _ask(engine: Engine, agent: Any, n: int = 1) -> CommandResult:
    task = asyncio.ensure_future(agent.run())
    try:
        return await engine.queue.run(command(n), timeout_s=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _memory_errors(metrics: AgentMetrics, operation: str) -> float:
    value = metrics.registry.get_sample_value(
        "watchd_agent_command_memory_errors_total", {"operation": operation}
    )
    return value or 0.0


@pytest.mark.parametrize("damage", ["deleted", "corrupt", "empty"])
async def test_engine_and_agent_restarted_with_the_memory_lost_reset_once(
    tmp_path: Path, damage: str
) -> None:
    state = tmp_path / "agent" / "commands.json"
    fake = _fake()
    store = Store.open(tmp_path / "state.db")
    async with Engine(store) as engine:
        first = runner(engine, fake, CommandMemory(state))
        fetched = asyncio.ensure_future(first.run())
        # the engine dies after the agent fetched the command, before its result: the run is not answered
        asked = asyncio.ensure_future(engine.queue.run(command(), timeout_s=10))
        for _ in range(1000):
            if fake.resets:
                break
            await asyncio.sleep(0.01)
        asked.cancel()
        fetched.cancel()
        await asyncio.gather(asked, fetched, return_exceptions=True)
    assert len(fake.resets) == 1
    if damage == "deleted":
        state.unlink()
    else:
        state.write_text("{not json" if damage == "corrupt" else "")
    metrics = AgentMetrics()
    async with Engine(store) as restarted:  # a new queue on the same state database
        again = runner(restarted, fake, CommandMemory(state), metrics=metrics)
        result = await _ask(restarted, again)
    store.close()
    assert len(fake.resets) == 1, "never reset twice"
    assert result.outcome == "unanswered", result
    assert f"fetched by the agent instance {first.instance}" in result.detail
    assert "fetched by an earlier run of this agent" in result.detail and "not run" in result.detail
    if damage != "deleted":
        assert (state.parent / "commands.json.unreadable").exists()
        assert _memory_errors(metrics, "read") == 1


async def test_a_restart_with_its_memory_whole_answers_and_runs_what_the_earlier_run_never_began(
    tmp_path: Path,
) -> None:
    """The memory covers the earlier run (its instance recorded): a command bound to it and not in the
    memory was never begun (nothing runs unrecorded), so the new run may run it."""
    state = tmp_path / "commands.json"
    fake = _fake()
    store = Store.open(tmp_path / "state.db")
    async with Engine(store) as engine:
        first = runner(engine, fake, CommandMemory(state))
        done = await _ask(engine, first, 1)
        # bound to the first run, which dies before it begins the second command
        asked = asyncio.ensure_future(engine.queue.run(command(2), timeout_s=10))
        await asyncio.sleep(0)
        engine.queue.fetch("gpu-1", first.instance)
        asked.cancel()
        await asyncio.gather(asked, return_exceptions=True)
    async with Engine(store) as restarted:
        again = runner(restarted, fake, CommandMemory(state))
        recalled = await _ask(restarted, again, 1)
        second = await _ask(restarted, again, 2)
    store.close()
    assert recalled == done and second.outcome == "done", (recalled, second)
    assert len(fake.resets) == 2


@pytest.mark.parametrize("failure", ["no_state_file", "full_disk", "folder_gone"])
async def test_no_durable_record_no_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    folder = tmp_path / "agent"
    memory = CommandMemory(None if failure == "no_state_file" else folder / "commands.json")
    if failure == "full_disk":

        def no_space(fd: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(command_memory.os, "fsync", no_space)
    elif failure == "folder_gone":
        for leftover in folder.iterdir():
            leftover.unlink()
        folder.rmdir()
    fake = _fake()
    metrics = AgentMetrics()
    async with Engine() as engine:
        result = await _ask(engine, runner(engine, fake, memory, metrics=metrics))
    assert result.outcome == "refused", result
    assert "could not record that it runs this command" in result.detail and result.detail.endswith("not run")
    assert fake.resets == [], "never run without its record"
    assert _memory_errors(metrics, "write") >= 1


def test_no_id_is_forgotten_because_newer_came_and_a_full_memory_refuses(tmp_path: Path) -> None:
    state = tmp_path / "commands.json"
    now = [1000.0]
    memory = CommandMemory(state, clock=lambda: now[0])
    for n in range(300):
        memory.record(f"c-{n}", {"state": "ended", "kind": "gpu_reset"})
    assert memory.get("c-0") is not None and CommandMemory(state).get("c-0") is not None
    for n in range(300, MAX_REMEMBERED):
        memory.record(f"c-{n}", {"state": "ended", "kind": "gpu_reset"})
    with pytest.raises(Unrecorded, match="holds 1024 commands of the last 30 days"):
        memory.record("one-more", {"state": "running", "kind": "gpu_reset"})
    now[0] += KEEP_S + 1  # past the keep: the oldest go
    memory.record("one-more", {"state": "running", "kind": "gpu_reset"})
    assert memory.get("c-0") is None and memory.get("one-more") is not None


def test_the_file_and_its_folder_are_opened_safely(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by its group or by anyone"):
        CommandMemory(shared / "commands.json")
    someone = tmp_path / "someone"
    someone.mkdir(mode=0o700)
    os.chown(someone, 4242, 4242)
    with pytest.raises(ConfigError, match="belongs to uid 4242, not to root or to the agent"):
        command_memory.check_folder(someone, uid=0)

    folder = tmp_path / "agent"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (folder / "commands.json").symlink_to(victim)
    (folder / "commands.json.tmp").symlink_to(victim)
    memory = CommandMemory(folder / "commands.json")  # the link is not followed: set aside
    assert memory.lost and (folder / "commands.json.unreadable").is_symlink()
    memory.record("c-1", {"state": "running", "kind": "gpu_reset"})
    assert victim.read_text() == "precious", "neither the file nor its temporary followed a link"
    written = folder / "commands.json"
    assert not written.is_symlink() and oct(written.stat().st_mode & 0o777) == "0o600"
    assert json.loads(written.read_text())["commands"]["c-1"]["state"] == "running"


async def test_an_engine_that_binds_nothing_is_refused_and_no_clock_is_compared(tmp_path: Path) -> None:
    fake = _fake()
    async with Engine() as engine:
        agent = runner(engine, fake, CommandMemory(tmp_path / "commands.json"))
        unbound = await agent._handle(command(1))  # as an older engine hands it: no bound_to
        from_the_past = command(2, issued_at=time.time() - 86400)  # another host's clock, a day behind
        task = asyncio.ensure_future(agent.run())
        ran = await engine.queue.run(from_the_past, timeout_s=10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert unbound is not None and unbound[0].outcome == "refused"
    assert "did not bind this command" in unbound[0].detail
    assert ran.outcome == "done" and len(fake.resets) == 1


async def test_a_folder_that_cannot_be_made_refuses_every_command_and_the_agent_runs_on(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    memory = CommandMemory(blocker / "agent" / "commands.json")  # cannot be created: no error at start
    assert memory.unusable
    fake = _fake()
    async with Engine() as engine:
        result = await _ask(engine, runner(engine, fake, memory))
    assert result.outcome == "refused" and "could not record that it runs this command" in result.detail
    assert fake.resets == []
