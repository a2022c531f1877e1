"""The agent's side of the command path (:mod:`watchd.model.commands`): every ``commands.poll_s`` it asks the
engine for its node's commands with its token, runs each one at most once, one at a time, and reports how it
ended.

Pulled, not pushed: the agent already reaches the engine (it ships its events there), the engine never
reaches the agents, and an idle node, the very one a reset waits for, may ship nothing for minutes; so the
agent polls on its own beat rather than waiting for an ingest reply to carry its commands.

At most once (:mod:`watchd.agent.command_memory`): a command runs only once the agent has durably recorded
that it runs it (``commands.state_file``); otherwise it is refused. The engine hands a command out at every
poll until its result arrives, and asks again with the same id after its own restart: the agent then reports
what it remembers. A command it began and never finished (the agent died meanwhile) is not run again but
reported failed: whether the reset happened is not known.

Each agent process is one *instance* (a random id), sent with every call; the engine binds a command to the
first instance that fetched it and hands it out with that binding. A command bound to an earlier run of this
agent that the memory does not cover (the file deleted, corrupt, or that run never recorded) is refused: that
run may have run it. No clock is compared with another host's."""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from watchd.agent import engine_call
from watchd.agent.command_memory import RUNNING, CommandMemory, Unrecorded
from watchd.agent.engine_call import call, with_session
from watchd.agent.metrics import AgentMetrics
from watchd.logs import get_logger
from watchd.model.commands import (
    COMMANDS_PATH,
    DONE,
    FAILED,
    REFUSED,
    Command,
    CommandResult,
    result_path,
)
from watchd.model.events import WIRE_VERSION, WireError

__all__ = ["CommandRunner", "Executor"]

_log = get_logger("watchd.agent.commands")

#: commands taken from one poll, at most (the engine keeps at most a few per node)
MAX_PER_POLL = 16
_MAX_REPLY_BYTES = 256 * 1024

Executor = Callable[[Command], Awaitable[CommandResult]]


class CommandRunner:
    def __init__(
        self,
        node: str,
        url: str,
        token: str | None,
        metrics: AgentMetrics,
        executors: Mapping[str, Executor],
        *,
        poll_s: float = 10.0,
        timeout_s: float = 5.0,
        memory: CommandMemory | None = None,
        tls: ssl.SSLContext | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.node = node
        self._base = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._metrics = metrics
        self._executors = executors
        self.poll_s = poll_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.memory = memory if memory is not None else CommandMemory(None)
        #: this process, as the engine knows it: the commands bound to it are this run's to run
        self.instance = secrets.token_hex(8)
        self.memory.adopt(self.instance)
        if self.memory.lost:
            metrics.command_memory_errors.labels("read").inc()
        if self.memory.unusable:
            _log.error("commands_all_refused", reason=self.memory.unusable, hint="set commands.state_file")
        self._tls = tls
        self._session = session
        self._unsupported_logged = False

    async def run(self) -> None:
        await with_session(self._session, self._tls, self._timeout, self._loop)

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            try:
                await self.poll_once(session)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one round must not end the polling
                _log.exception("command_poll_failed_unexpectedly")
            await asyncio.sleep(self.poll_s * (0.9 + 0.2 * random.random()))  # spread the fleet's polls

    async def poll_once(self, session: aiohttp.ClientSession) -> int:
        """One poll: fetch the node's commands, run (or recall) each, report each; how many were handled."""
        commands = await self._fetch(session)
        for command in commands[:MAX_PER_POLL]:
            handled = await self._handle(command)
            if handled is not None:
                await self._report(session, *handled)
        return len(commands)

    async def _fetch(self, session: aiohttp.ClientSession) -> list[Command]:
        url = self._base + COMMANDS_PATH
        reply = await call(
            session,
            "GET",
            url,
            params={"node": self.node, "instance": self.instance},
            headers=self._headers,
            timeout=self._timeout,
            read_at_most=_MAX_REPLY_BYTES + 1,
        )
        kind = reply.kind
        if kind == engine_call.NOT_REACHED:
            self._metrics.command_polls.labels("unreachable").inc()
            _log.warning("command_poll_unreachable", url=url, error=reply.error)
            return []
        if kind == engine_call.NOT_FOUND:  # an engine without the command path (older): said once
            self._metrics.command_polls.labels("unsupported").inc()
            if not self._unsupported_logged:
                self._unsupported_logged = True
                _log.warning("commands_unsupported_by_engine", url=url)
            return []
        if kind != engine_call.OK:
            self._metrics.command_polls.labels("refused").inc()
            _log.warning("command_poll_refused", url=url, status=reply.status, response=reply.text(300))
            return []
        try:
            body = json.loads(reply.body[:_MAX_REPLY_BYTES])
            if not isinstance(body, dict) or body.get("version") != WIRE_VERSION:
                raise WireError(f"version: expected {WIRE_VERSION}")
            listed = body.get("commands")
            if not isinstance(listed, list):
                raise WireError("commands: expected a list")
            commands = [Command.from_wire(c) for c in listed]
        except (ValueError, WireError) as exc:
            self._metrics.command_polls.labels("invalid").inc()
            _log.error("command_poll_invalid", url=url, error=str(exc))
            return []
        self._metrics.command_polls.labels("ok").inc()
        return commands

    async def _handle(self, command: Command) -> tuple[CommandResult, str] | None:
        """The result of ``command`` and the instance it is reported as: run now (once), or what the agent
        remembers of it."""
        if command.node != self.node:
            _log.error("command_for_another_node", command=command.id, node=command.node, agent=self.node)
            return None
        seen = self.memory.get(command.id)
        if seen is not None:
            return self._recalled(command, seen), str(seen.get("as") or self.instance)
        refusal = self._refusal(command)
        if refusal is not None:
            return self._ended(command, self._refused(command, refusal), self.instance)
        executor = self._executors.get(command.kind)
        if executor is None:
            return self._ended(command, self._refused(command, f"this agent does not do {command.kind!r}"))
        # run under the binding: this instance, or an earlier run of it whose every run this memory holds
        run_as = command.bound_to
        try:
            self.memory.record(command.id, {"state": RUNNING, "kind": command.kind, "as": run_as})
        except Unrecorded as exc:
            self._metrics.command_memory_errors.labels("write").inc()
            detail = f"the agent could not record that it runs this command ({exc}): not run"
            return self._ended(command, self._refused(command, detail), self.instance)
        _log.warning("command_running", command=command.id, kind=command.kind, args=dict(command.args))
        started = time.monotonic()
        try:
            result = await executor(command)
        except Exception as exc:  # the executor's bug: reported, never re-run
            _log.exception("command_crashed", command=command.id)
            result = CommandResult(command.id, FAILED, f"internal error: {exc!r}", finished_at=time.time())
        self._metrics.command_seconds.labels(command.kind).observe(time.monotonic() - started)
        return self._ended(command, result, run_as)

    def _refusal(self, command: Command) -> str | None:
        """Why ``command`` may not run on this run of the agent, or None."""
        bound = command.bound_to
        if not bound:
            return (
                "the engine did not bind this command to a run of the agent (an engine older than the "
                "agent): not run"
            )
        if bound != self.instance and not self.memory.knows(bound):
            lost = f" (its memory was lost: {self.memory.lost})" if self.memory.lost else ""
            return (
                f"fetched by an earlier run of this agent (instance {bound}){lost}; whether it ran is not "
                "known: not run"
            )
        return None

    def _recalled(self, command: Command, seen: Mapping[str, Any]) -> CommandResult:
        if seen.get("state") == RUNNING:
            # begun by an agent that died before it ended: whether it ran is not known; never again
            result = CommandResult(
                command.id,
                FAILED,
                "the agent restarted while it ran this command: not run again, its outcome is not known",
                finished_at=time.time(),
            )
            self._remember(command, result, str(seen.get("as") or self.instance))
            return result
        try:
            return CommandResult.from_wire(seen.get("result"))
        except WireError as exc:  # a damaged memory: still never run twice
            return CommandResult(command.id, FAILED, f"ran before; its result is unreadable ({exc})")

    def _refused(self, command: Command, detail: str) -> CommandResult:
        return CommandResult(command.id, REFUSED, detail, finished_at=time.time())

    def _ended(
        self, command: Command, result: CommandResult, report_as: str | None = None
    ) -> tuple[CommandResult, str]:
        report_as = report_as or self.instance
        self._remember(command, result, report_as)
        log = _log.info if result.outcome == DONE else _log.error
        log(
            "command_ended",
            command=command.id,
            kind=command.kind,
            outcome=result.outcome,
            detail=result.detail,
        )
        self._metrics.commands.labels(command.kind, result.outcome).inc()
        return result, report_as

    def _remember(self, command: Command, result: CommandResult, report_as: str) -> None:
        entry = {"state": "ended", "kind": command.kind, "as": report_as, "result": result.to_wire()}
        try:
            self.memory.record(command.id, entry)
        except Unrecorded:  # a result not on disk: a later run reports the command failed (it was running)
            self._metrics.command_memory_errors.labels("write").inc()

    async def _report(self, session: aiohttp.ClientSession, result: CommandResult, report_as: str) -> bool:
        """Report ``result`` once; a failed report is tried again at the next poll (the engine hands the
        command out until it has the result)."""
        reply = await call(
            session,
            "POST",
            self._base + result_path(result.id),
            params={"node": self.node, "instance": report_as},
            json=result.to_wire(),
            headers=self._headers,
            timeout=self._timeout,
            read_at_most=2000,
        )
        if reply.kind == engine_call.NOT_REACHED:
            _log.warning("command_report_unreachable", command=result.id, error=reply.error)
            return False
        if reply.kind == engine_call.OK:
            _log.info("command_reported", command=result.id, outcome=result.outcome)
            return True
        # 404/410: the engine no longer waits for it (restarted, or gave up): kept, reported again if asked
        _log.warning(
            "command_report_refused", command=result.id, status=reply.status, response=reply.text(300)
        )
        return False
