"""The engine's side of the agents' command path (:mod:`watchd.model.commands`): the commands waiting for each
node's agent, in memory, and the two routes the agents call with their token.

A command exists here only while an action waits for it (``gpu_reset``): the action's intent, written before
the command is queued, is its durable record. After a ``kill -9`` of the engine the intent is driven again and
asks again with the same id, and the agent, which runs an id at most once, reports what it remembers instead
of running it again.

What the agent may have forgotten (its ``commands.state_file`` deleted, corrupt, unwritable) the engine keeps:
before a command is first handed out it is bound, in the state database
(:mod:`watchd.store.command_bindings`), to the agent instance that asked (a random id per agent process), and
it is handed out with that binding (``bound_to``) at every poll after, by this engine or any other reading the
same store. A later run of the agent that does not remember the command refuses it instead of running it. A
result is taken only with the node it is for and from the instance it is bound to; another instance may only
say it did not run it (which ends the command ``unanswered``: whether the bound instance ran it is not known).

A command is valid only while the reason for it holds: the action that queues it may give a check
(:data:`Validity`), asked right before the command is first handed out. A command whose reason no longer holds
(the node resumed, a job put on it, drained again since, marked) is withdrawn then, never handed out, and
ends ``withdrawn``; a check that cannot answer (the scheduler unreachable) keeps the command back for that
poll. Once handed out, the agent's own evidence of a job guards the rest.

Bounded: at most ``max_pending`` commands across the fleet and ``max_per_node`` per node (more are answered
``not_queued`` at once); each wait is bounded by its action (``timeout``); the nodes whose last poll is kept
(for the detail of a command never fetched) are at most ``MAX_NODES_SEEN``. Delivery is at least once: a
command is handed out at every poll of its node until its result arrives."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from watchd.clock import Clock
from watchd.httputil import BodyError, error_response, json_response, read_json
from watchd.logs import get_logger
from watchd.model.commands import (
    COMMANDS_PATH,
    REFUSED,
    WITHDRAWN,
    Command,
    CommandResult,
    Validity,
    valid_id,
    valid_instance,
    valid_node,
)
from watchd.model.events import WIRE_VERSION, WireError
from watchd.store.connection import StoreError
from watchd.subsystem import Component, Operator

__all__ = [
    "EXPIRED",
    "NOT_QUEUED",
    "UNANSWERED",
    "WITHDRAWN",
    "AgentCommands",
    "Bindings",
    "MemoryBindings",
    "Validity",
]

_log = get_logger("watchd.agent_commands")

#: the engine's own outcomes of a command no result came for
EXPIRED = "expired"  # never fetched by the node's agent
UNANSWERED = "unanswered"  # fetched, and no result in time
NOT_QUEUED = "not_queued"  # too many commands pending
LATE = "late"  # a result that came after the engine stopped waiting (counted, not used)
MAX_NODES_SEEN = 100_000
_MAX_RESULT_BYTES = 64 * 1024
_LATE_KEPT = 1000


class Bound(Protocol):
    @property
    def instance(self) -> str: ...


class Bindings(Protocol):
    """Which agent instance each command was first handed to: :class:`watchd.store.command_bindings.
    CommandBindings` (durable, shared by the engines of one store), or :class:`MemoryBindings` (tests)."""

    def bind(self, command_id: str, node: str, instance: str, at: float) -> Bound:
        """Bind unless bound already; the binding either way. Raises StoreError when it cannot be written."""
        ...

    def get(self, command_id: str) -> Bound | None: ...

    def finish(self, command_id: str, at: float) -> None: ...


@dataclass(frozen=True, slots=True)
class _Binding:
    instance: str


class MemoryBindings:
    """Bindings in memory only: lost with the engine (an engine without a state database; tests)."""

    def __init__(self) -> None:
        self._by_id: OrderedDict[str, _Binding] = OrderedDict()

    def bind(self, command_id: str, node: str, instance: str, at: float) -> Bound:
        bound = self._by_id.setdefault(command_id, _Binding(instance))
        while len(self._by_id) > MAX_NODES_SEEN:
            self._by_id.popitem(last=False)
        return bound

    def get(self, command_id: str) -> Bound | None:
        return self._by_id.get(command_id)

    def finish(self, command_id: str, at: float) -> None:
        pass


@dataclass(slots=True)
class _Pending:
    command: Command
    queued_at: float  # monotonic
    future: asyncio.Future[CommandResult]
    fetched_at: float | None = None  # monotonic: the first poll that handed it out
    bound_to: str = ""  # the agent instance it is bound to, once handed out
    valid: Validity | None = None  # asked right before it is first handed out
    held_back: bool = False  # its check could not answer at the last poll: not handed out


class CallRefused(Exception):
    """An agent's call answered with an error: ``status``, ``reason`` (a metric label) and the detail."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.detail = detail


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
        bindings: Bindings | None = None,
    ) -> None:
        self._clock = clock
        self._bindings: Bindings = bindings if bindings is not None else MemoryBindings()
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
        self.refused = Counter(
            "watchd_agent_command_calls_refused",
            "Agents' calls of the command path refused, by call (fetch, result) and reason: no_node, "
            "no_instance (an agent older than the engine), other_node (a result for another node's command), "
            "other_instance (a result from an agent run the command is not bound to), not_handed_out, "
            "not_bound (the binding could not be recorded: the state database).",
            ["call", "reason"],
            registry=registry,
        )

    # ------------------------------------------------------------------------------------- the actions'

    def last_poll_s(self, node: str) -> float | None:
        """Seconds since the agent of ``node`` last asked for its commands; None if it never did (since the
        engine started)."""
        at = self._last_poll.get(node)
        return None if at is None else self._clock.monotonic() - at

    async def run(self, command: Command, timeout_s: float, valid: Validity | None = None) -> CommandResult:
        """Queue ``command`` for its node's agent and wait up to ``timeout_s`` for its result. Never raises
        for the agent's sake: a command never fetched ends ``expired`` (withdrawn), one whose ``valid`` said
        its reason no longer holds when the agent asked ``withdrawn``, one fetched and not answered
        ``unanswered``, one over the bounds ``not_queued``."""
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
            pending = _Pending(command, self._clock.monotonic(), future, valid=valid)
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
        self._finish_binding(pending)
        return self._ended(command, result)

    def _finish_binding(self, pending: _Pending) -> None:
        if pending.fetched_at is None:
            return
        try:
            self._bindings.finish(pending.command.id, self._clock.now())
        except StoreError as exc:  # kept unfinished: pruned after its own bound
            _log.error("agent_command_binding_not_finished", command=pending.command.id, error=str(exc))

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

    async def withdraw_invalid(self, node: str) -> None:
        """Ask the check of each command of ``node`` not handed out yet: withdraw those whose reason no
        longer holds; keep back (not handed out this time) those whose check could not answer."""
        for pending in list(self._by_node.get(node, {}).values()):
            if pending.bound_to or pending.valid is None:
                continue
            try:
                why = await pending.valid()
            except Exception as exc:  # cannot tell now: not handed out, asked again at the next poll
                _log.warning(
                    "agent_command_validity_unknown", node=node, command=pending.command.id, error=str(exc)
                )
                pending.held_back = True
                continue
            pending.held_back = False
            if why is None or pending.future.done() or pending.bound_to:
                continue
            self._drop(pending.command)
            result = CommandResult(
                pending.command.id,
                WITHDRAWN,
                f"withdrawn before its agent fetched it: {why}; nothing was run",
            )
            _log.warning("agent_command_withdrawn", node=node, command=pending.command.id, reason=why)
            pending.future.set_result(result)
            self._ended(pending.command, result)

    # ------------------------------------------------------------------------------------- the agents'

    def fetch(self, node: str, instance: str) -> list[Command]:
        """The commands pending for ``node``, whose agent ``instance`` asks: handed out until their result
        comes, each with the instance it is bound to (the first that fetched it: bound, durably, before it
        is first handed out). Raises :class:`CallRefused` (503) when a binding cannot be recorded."""
        now = self._clock.monotonic()
        self._last_poll[node] = now
        self._last_poll.move_to_end(node)
        while len(self._last_poll) > MAX_NODES_SEEN:
            self._last_poll.popitem(last=False)
        out = []
        for pending in list(self._by_node.get(node, {}).values()):
            if pending.held_back:
                continue
            if not pending.bound_to:
                try:
                    bound = self._bindings.bind(pending.command.id, node, instance, self._clock.now())
                except StoreError as exc:  # never handed out unbound: asked again at the next poll
                    _log.error(
                        "agent_command_not_bound", node=node, command=pending.command.id, error=str(exc)
                    )
                    self.refused.labels("fetch", "not_bound").inc()
                    raise CallRefused(
                        503, "not_bound", f"command {pending.command.id}: its binding cannot be recorded"
                    ) from None
                pending.bound_to = bound.instance
            if pending.fetched_at is None:
                pending.fetched_at = now
                _log.info(
                    "agent_command_fetched",
                    node=node,
                    command=pending.command.id,
                    instance=instance,
                    bound_to=pending.bound_to,
                )
            out.append(replace(pending.command, bound_to=pending.bound_to))
        return out

    def report(self, node: str, instance: str, result: CommandResult) -> tuple[int, str]:
        """An agent's result: (HTTP status, what to answer). 200 taken; 404 unknown (an engine restarted
        since: the action asks again with the same id if it still waits); 410 no longer waited for; 409 for
        another node, or from an agent instance the command is not bound to (but another instance's refusal,
        which ends it ``unanswered``: whether the bound instance ran it is not known)."""
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
        command = pending.command
        if node != command.node:
            return self._refuse(
                "other_node",
                409,
                f"command {result.id} is for {command.node}, not {node}",
                node,
                instance,
                result,
            )
        bound = pending.bound_to
        if not bound:
            try:
                found = self._bindings.get(command.id)
            except StoreError as exc:
                return self._refuse("not_bound", 503, str(exc), node, instance, result)
            bound = found.instance if found is not None else ""
        if not bound:
            return self._refuse(
                "not_handed_out", 409, f"command {result.id} was not handed out yet", node, instance, result
            )
        if instance != bound:
            if result.outcome != REFUSED:
                return self._refuse(
                    "other_instance",
                    409,
                    f"command {result.id} is bound to the agent instance {bound}, not {instance}",
                    node,
                    instance,
                    result,
                )
            result = CommandResult(
                result.id,
                UNANSWERED,
                f"fetched by the agent instance {bound}, whose result never came; the agent instance "
                f"{instance} refused it ({result.detail}): whether {bound} ran it is not known",
                finished_at=result.finished_at,
            )
        self._drop(command)
        if not pending.future.done():
            pending.future.set_result(result)
        _log.info(
            "agent_command_result",
            node=command.node,
            command=result.id,
            instance=instance,
            outcome=result.outcome,
            detail=result.detail,
        )
        self._finish_binding(pending)
        self._ended(command, result)
        return 200, "accepted"

    def _refuse(
        self, reason: str, status: int, detail: str, node: str, instance: str, result: CommandResult
    ) -> tuple[int, str]:
        self.refused.labels("result", reason).inc()
        _log.error(
            "agent_command_result_refused",
            reason=reason,
            node=node,
            instance=instance,
            command=result.id,
            outcome=result.outcome,
            detail=detail,
        )
        return status, detail

    # ------------------------------------------------------------------------------------- the subsystem

    def _caller(self, request: web.Request, call: str) -> tuple[str, str]:
        """The calling agent's node and instance (``?node=N&instance=I``); :class:`CallRefused` (400)."""
        node, instance = request.query.get("node"), request.query.get("instance")
        if not valid_node(node):
            self.refused.labels(call, "no_node").inc()
            raise CallRefused(400, "no_node", "node: expected ?node=<the agent's node name>")
        if not valid_instance(instance):
            self.refused.labels(call, "no_instance").inc()
            _log.error("agent_command_call_without_instance", call=call, node=node)
            raise CallRefused(
                400,
                "no_instance",
                "instance: expected ?instance=<the agent's instance id> (an agent older than this engine: "
                "upgrade it, commands are handed only to an agent that says which run of it asks)",
            )
        assert node is not None and instance is not None
        return node, instance

    def routes(self, app: web.Application, operator: Operator) -> None:
        async def fetch(request: web.Request) -> web.Response:
            try:
                node, instance = self._caller(request, "fetch")
                if not self._leading():  # a deposed leader hands nothing out: the agent asks the leader
                    return error_response(503, "not the leader: ask the leader for commands")
                await self.withdraw_invalid(node)
                commands = self.fetch(node, instance)
            except CallRefused as exc:
                return error_response(exc.status, exc.detail)
            return json_response({"version": WIRE_VERSION, "commands": [c.to_wire() for c in commands]})

        async def result(request: web.Request) -> web.Response:
            command_id = request.match_info["id"]
            if not valid_id(command_id):
                return error_response(400, "id: not a command id")
            try:
                node, instance = self._caller(request, "result")
            except CallRefused as exc:
                _log.error("agent_command_result_refused", reason=exc.reason, command=command_id)
                return error_response(exc.status, exc.detail)
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
            status, detail = self.report(node, instance, reported)
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
                    "bound_to": p.bound_to,
                }
                for p in list(self._by_id.values())[:100]
            ],
            "pending_total": len(self._by_id),
            "agents_polling": sum(1 for at in self._last_poll.values() if now - at < 300.0),
        }
