"""The engine's side of the agents' command path (:mod:`watchd.model.commands`): the commands waiting for each
node's agent, in memory, and the two routes the agents call with their token.

A command exists here only while an action waits for it (``gpu_reset``): the action's intent, written before
the command is queued, is its durable record. After a ``kill -9`` of the engine the intent is driven again and
asks again with the same id, and the agent, which runs an id at most once, reports what it remembers instead
of running it again. So nothing here is written to the state database, and nothing is lost with it.

Bounded: at most ``max_pending`` commands across the fleet and ``max_per_node`` per node (more are answered
``not_queued`` at once); each wait is bounded by its action (``timeout``); the nodes whose last poll is kept
(for the detail of a command never fetched) are at most ``MAX_NODES_SEEN``. Delivery is at least once: a
command is handed out at every poll of its node until its result arrives."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from watchd.clock import Clock
from watchd.httputil import BodyError, error_response, json_response, read_json
from watchd.logs import get_logger
from watchd.model.commands import (
    COMMANDS_PATH,
    Command,
    CommandResult,
    valid_id,
    valid_node,
)
from watchd.model.events import WIRE_VERSION, WireError
from watchd.subsystem import Component, Operator

__all__ = ["EXPIRED", "NOT_QUEUED", "UNANSWERED", "AgentCommands"]

_log = get_logger("watchd.agent_commands")

#: the engine's own outcomes of a command no result came for
EXPIRED = "expired"  # never fetched by the node's agent
UNANSWERED = "unanswered"  # fetched, and no result in time
NOT_QUEUED = "not_queued"  # too many commands pending
LATE = "late"  # a result that came after the engine stopped waiting (counted, not used)
MAX_NODES_SEEN = 100_000
_MAX_RESULT_BYTES = 64 * 1024
_LATE_KEPT = 1000


@dataclass(slots=True)
class _Pending:
    command: Command
    queued_at: float  # monotonic
    future: asyncio.Future[CommandResult]
    fetched_at: float | None = None  # monotonic: the first poll that handed it out


class AgentCommands(Component):
    name = "agent_commands"

    def __init__(
        self,
        clock: Clock,
        registry: CollectorRegistry | None = None,
        *,
        max_pending: int = 10_000,
        max_per_node: int = 4,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self._clock = clock
        self._leading = leading
        self._max_pending = max_pending
        self._max_per_node = max_per_node
        self._by_id: dict[str, _Pending] = {}
        self._by_node: dict[str, dict[str, _Pending]] = {}
        self._last_poll: OrderedDict[str, float] = OrderedDict()  # node -> monotonic, oldest first
        self._late: OrderedDict[str, str] = OrderedDict()  # id -> kind: no longer waited for, newest last
        self.finished = Counter(
            "watchd_agent_commands",
            "Commands the engine asked of agents, by command and how each ended: done, refused, failed (the "
            "agent's report); expired (never fetched), unanswered (fetched, no result in time), not_queued "
            "(too many pending), late (a result after the engine stopped waiting).",
            ["command", "outcome"],
            registry=registry,
        )
        self.pending = Gauge(
            "watchd_agent_commands_pending", "Commands waiting for their agent's result.", registry=registry
        )
        self.pending.set_function(lambda: float(len(self._by_id)))

    # ------------------------------------------------------------------------------------- the actions'

    def last_poll_s(self, node: str) -> float | None:
        """Seconds since the agent of ``node`` last asked for its commands; None if it never did (since the
        engine started)."""
        at = self._last_poll.get(node)
        return None if at is None else self._clock.monotonic() - at

    async def run(self, command: Command, timeout_s: float) -> CommandResult:
        """Queue ``command`` for its node's agent and wait up to ``timeout_s`` for its result. Never raises
        for the agent's sake: a command never fetched ends ``expired`` (withdrawn), one fetched and not
        answered ``unanswered``, one over the bounds ``not_queued``."""
        pending = self._by_id.get(command.id)
        if pending is None:
            node_queue = self._by_node.get(command.node, {})
            if len(self._by_id) >= self._max_pending or len(node_queue) >= self._max_per_node:
                why = (
                    f"{len(node_queue)} commands pending for {command.node} (at most {self._max_per_node})"
                    if len(node_queue) >= self._max_per_node
                    else f"{len(self._by_id)} commands pending (at most {self._max_pending})"
                )
                _log.error("agent_command_not_queued", node=command.node, command=command.id, reason=why)
                return self._ended(command, CommandResult(command.id, NOT_QUEUED, f"not queued: {why}"))
            future: asyncio.Future[CommandResult] = asyncio.get_running_loop().create_future()
            pending = _Pending(command, self._clock.monotonic(), future)
            self._by_id[command.id] = pending
            self._by_node.setdefault(command.node, {})[command.id] = pending
            _log.info(
                "agent_command_queued",
                node=command.node,
                command=command.id,
                kind=command.kind,
                args=dict(command.args),
                timeout_s=timeout_s,
            )
        try:
            return await asyncio.wait_for(asyncio.shield(pending.future), timeout_s)
        except TimeoutError:
            return self._gave_up(pending)
        except asyncio.CancelledError:  # the engine stops: the intent stays open and asks again
            self._drop(pending.command)
            raise

    def _gave_up(self, pending: _Pending) -> CommandResult:
        command = pending.command
        if pending.future.done():  # answered right at the deadline
            return pending.future.result()
        self._drop(command)
        self._late[command.id] = command.kind
        while len(self._late) > _LATE_KEPT:
            self._late.popitem(last=False)
        waited = self._clock.monotonic() - pending.queued_at
        if pending.fetched_at is None:
            since = self.last_poll_s(command.node)
            polled = (
                "its agent has not asked for commands since the engine started (is it running, with "
                "commands.enabled?)"
                if since is None
                else f"its agent last asked {since:.0f} s ago"
            )
            result = CommandResult(
                command.id, EXPIRED, f"not fetched in {waited:.0f} s ({polled}): withdrawn, nothing was run"
            )
        else:
            fetched = self._clock.monotonic() - pending.fetched_at
            result = CommandResult(
                command.id,
                UNANSWERED,
                f"fetched by the agent {fetched:.0f} s ago, no result in {waited:.0f} s: whether it ran is "
                "not known",
            )
        _log.error("agent_command_timed_out", node=command.node, command=command.id, outcome=result.outcome)
        return self._ended(command, result)

    def _ended(self, command: Command, result: CommandResult) -> CommandResult:
        self.finished.labels(command.kind, result.outcome).inc()
        return result

    def _drop(self, command: Command) -> None:
        self._by_id.pop(command.id, None)
        node_queue = self._by_node.get(command.node)
        if node_queue is not None:
            node_queue.pop(command.id, None)
            if not node_queue:
                del self._by_node[command.node]

    # ------------------------------------------------------------------------------------- the agents'

    def fetch(self, node: str) -> list[Command]:
        """The commands pending for ``node`` (its agent asks): handed out until their result comes."""
        now = self._clock.monotonic()
        self._last_poll[node] = now
        self._last_poll.move_to_end(node)
        while len(self._last_poll) > MAX_NODES_SEEN:
            self._last_poll.popitem(last=False)
        out = []
        for pending in self._by_node.get(node, {}).values():
            if pending.fetched_at is None:
                pending.fetched_at = now
                _log.info("agent_command_fetched", node=node, command=pending.command.id)
            out.append(pending.command)
        return out

    def report(self, node: str | None, result: CommandResult) -> tuple[int, str]:
        """An agent's result: (HTTP status, what to answer). 200 taken; 404 unknown (an engine restarted
        since: the action asks again with the same id if it still waits); 410 no longer waited for."""
        pending = self._by_id.get(result.id)
        if pending is None:
            if (kind := self._late.get(result.id)) is not None:
                self.finished.labels(kind, LATE).inc()
                _log.warning(
                    "agent_command_result_late",
                    node=node,
                    command=result.id,
                    outcome=result.outcome,
                    detail=result.detail,
                )
                return 410, f"command {result.id}: the engine stopped waiting for its result"
            return 404, f"command {result.id}: not pending here"
        if node is not None and node != pending.command.node:
            return 409, f"command {result.id} is for {pending.command.node}, not {node}"
        self._drop(pending.command)
        if not pending.future.done():
            pending.future.set_result(result)
        _log.info(
            "agent_command_result",
            node=pending.command.node,
            command=result.id,
            outcome=result.outcome,
            detail=result.detail,
        )
        self._ended(pending.command, result)
        return 200, "accepted"

    # ------------------------------------------------------------------------------------- the subsystem

    def routes(self, app: web.Application, operator: Operator) -> None:
        async def fetch(request: web.Request) -> web.Response:
            node = request.query.get("node")
            if not valid_node(node):
                return error_response(400, "node: expected ?node=<the agent's node name>")
            assert node is not None
            if not self._leading():  # a deposed leader hands nothing out: the agent asks the leader
                return error_response(503, "not the leader: ask the leader for commands")
            commands = self.fetch(node)
            return json_response({"version": WIRE_VERSION, "commands": [c.to_wire() for c in commands]})

        async def result(request: web.Request) -> web.Response:
            command_id = request.match_info["id"]
            if not valid_id(command_id):
                return error_response(400, "id: not a command id")
            try:
                body = await read_json(request, _MAX_RESULT_BYTES)
            except BodyError as exc:
                return error_response(exc.status, exc.reason)
            except ValueError as exc:
                return error_response(400, str(exc))
            try:
                reported = CommandResult.from_wire(body)
            except WireError as exc:
                return error_response(400, f"invalid result: {exc}")
            if reported.id != command_id:
                return error_response(400, f"the body's id {reported.id!r} is not the path's")
            node = request.query.get("node")
            status, detail = self.report(node if valid_node(node) else None, reported)
            if status != 200:
                return error_response(status, detail)
            return json_response({"accepted": True})

        app.router.add_get(COMMANDS_PATH, fetch)
        app.router.add_post(COMMANDS_PATH + "/{id}/result", result)

    def status(self) -> Mapping[str, Any]:
        now = self._clock.monotonic()
        return {
            "pending": [
                {
                    "id": p.command.id,
                    "node": p.command.node,
                    "kind": p.command.kind,
                    "args": dict(p.command.args),
                    "waiting_s": round(now - p.queued_at, 1),
                    "fetched": p.fetched_at is not None,
                }
                for p in list(self._by_id.values())[:100]
            ],
            "pending_total": len(self._by_id),
            "agents_polling": sum(1 for at in self._last_poll.values() if now - at < 300.0),
        }
