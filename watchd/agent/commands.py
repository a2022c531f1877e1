"""The agent's side of the command path (:mod:`watchd.model.commands`): every ``commands.poll_s`` it asks the
engine for its node's commands with its token, runs each one at most once, one at a time, and reports how it
ended.

Pulled, not pushed: the agent already reaches the engine (it ships its events there), the engine never
reaches the agents, and an idle node, the very one a reset waits for, may ship nothing for minutes; so the
agent polls on its own beat rather than waiting for an ingest reply to carry its commands.

At most once: the ids it ran and their results are remembered (``commands.state_file``, written before a
command runs and after it ends, at most :data:`MAX_REMEMBERED` of them). The engine hands a command out at
every poll until its result arrives, and asks again with the same id after its own restart: the agent then
reports what it remembers. A command it began and never finished (the agent died meanwhile) is not run again
but reported failed: whether the reset happened is not known. Without a state file, a command issued before
this agent started is refused: its previous incarnation may have run it."""

from __future__ import annotations

import asyncio
import json
import os
import random
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from watchd.agent import engine_call
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

__all__ = ["CommandMemory", "CommandRunner", "Executor"]

_log = get_logger("watchd.agent.commands")

#: the ids (and results) the agent keeps; a node gets a few commands a week
MAX_REMEMBERED = 256
#: commands taken from one poll, at most (the engine keeps at most a few per node)
MAX_PER_POLL = 16
_MAX_REPLY_BYTES = 256 * 1024
RUNNING = "running"

Executor = Callable[[Command], Awaitable[CommandResult]]


class CommandMemory:
    """The commands this agent ran, by id: ``running`` while one runs, then its result; kept in ``path``
    (written atomically) when given."""

    def __init__(self, path: Path | None, started_at: float) -> None:
        self.path = path
        self.started_at = started_at
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            raw = json.loads(path.read_text())
            entries = raw["commands"]
            if not isinstance(entries, dict):
                raise ValueError("commands: not an object")
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            aside = path.with_name(path.name + ".unreadable")
            try:
                os.replace(path, aside)
            except OSError:
                aside = path
            _log.error("command_memory_unreadable", path=str(path), error=str(exc), kept_as=str(aside))
            return
        for command_id, entry in entries.items():
            if isinstance(entry, dict):
                self._entries[str(command_id)] = entry

    def get(self, command_id: str) -> dict[str, Any] | None:
        return self._entries.get(command_id)

    def remember(self, command_id: str, entry: dict[str, Any]) -> None:
        self._entries[command_id] = entry
        self._entries.move_to_end(command_id)
        while len(self._entries) > MAX_REMEMBERED:
            self._entries.popitem(last=False)
        self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump({"version": 1, "commands": self._entries}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:  # kept in memory: the next write tries again
            _log.error("command_memory_unwritable", path=str(self.path), error=str(exc))


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
        self.memory = memory or CommandMemory(None, time.time())
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
            result = await self._handle(command)
            if result is not None:
                await self._report(session, result)
        return len(commands)

    async def _fetch(self, session: aiohttp.ClientSession) -> list[Command]:
        url = self._base + COMMANDS_PATH
        reply = await call(
            session,
            "GET",
            url,
            params={"node": self.node},
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

    async def _handle(self, command: Command) -> CommandResult | None:
        """The result of ``command``: run now (once), or what the agent remembers of it."""
        if command.node != self.node:
            _log.error("command_for_another_node", command=command.id, node=command.node, agent=self.node)
            return None
        seen = self.memory.get(command.id)
        if seen is not None:
            if seen.get("state") == RUNNING:
                # begun by an agent that died before it ended: whether it ran is not known; never again
                result = CommandResult(
                    command.id,
                    FAILED,
                    "the agent restarted while it ran this command: not run again, its outcome is not known",
                    finished_at=time.time(),
                )
                self._remember(command, result)
                return result
            try:
                return CommandResult.from_wire(seen.get("result"))
            except WireError as exc:  # a damaged memory: still never run twice
                return CommandResult(command.id, FAILED, f"ran before; its result is unreadable ({exc})")
        if self.memory.path is None and command.issued_at < self.memory.started_at:
            result = CommandResult(
                command.id,
                REFUSED,
                "issued before this agent started, and the agent keeps no commands.state_file: its previous "
                "run may have done it; not run",
                finished_at=time.time(),
            )
            self._remember(command, result)
            return result
        executor = self._executors.get(command.kind)
        if executor is None:
            result = CommandResult(
                command.id, REFUSED, f"this agent does not do {command.kind!r}", finished_at=time.time()
            )
        else:
            self.memory.remember(command.id, {"state": RUNNING, "kind": command.kind, "at": time.time()})
            _log.warning("command_running", command=command.id, kind=command.kind, args=dict(command.args))
            started = time.monotonic()
            try:
                result = await executor(command)
            except Exception as exc:  # the executor's bug: reported, never re-run
                _log.exception("command_crashed", command=command.id)
                result = CommandResult(
                    command.id, FAILED, f"internal error: {exc!r}", finished_at=time.time()
                )
            self._metrics.command_seconds.labels(command.kind).observe(time.monotonic() - started)
        self._remember(command, result)
        log = _log.info if result.outcome == DONE else _log.error
        log(
            "command_ended",
            command=command.id,
            kind=command.kind,
            outcome=result.outcome,
            detail=result.detail,
        )
        self._metrics.commands.labels(command.kind, result.outcome).inc()
        return result

    def _remember(self, command: Command, result: CommandResult) -> None:
        self.memory.remember(command.id, {"state": "ended", "kind": command.kind, "result": result.to_wire()})

    async def _report(self, session: aiohttp.ClientSession, result: CommandResult) -> bool:
        """Report ``result`` once; a failed report is tried again at the next poll (the engine hands the
        command out until it has the result)."""
        reply = await call(
            session,
            "POST",
            self._base + result_path(result.id),
            params={"node": self.node},
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
