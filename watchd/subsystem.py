"""The engine as a list of subsystems, in the spirit of gpud's components: each part of the engine that is
more than the rules and the actions (the detectors, reliability accounting, the fleet view and its hot spares,
the active checks, the usage observations) is one object behind this small lifecycle protocol, and the engine
composes the list once: each subsystem declares the event kinds it takes (:meth:`~Subsystem.subscriptions`,
kind -> handler) and what it takes of the engine's own news (:meth:`~Subsystem.news`: a rule's decision, an
action's outcome, a node back in service..., by type), and the engine builds its dispatch tables from them
once (:class:`Dispatch`, :class:`News`): a subsystem is never called for a kind it did not ask for. Their
periodic jobs go on the engine's APScheduler; their HTTP routes are added under the server's auth
middleware; their Prometheus collectors are registered; their part of the status document is read; they are
started in order and stopped in reverse.

:class:`Component` gives every method a harmless default, so a subsystem says only what it does. Kept at the
bottom of the house (it imports nothing of watchd but the event type) so that the domain packages implement
it without importing the engine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from aiohttp import web
    from prometheus_client.registry import Collector

    from watchd.model.events import Event

__all__ = ["ANY", "Component", "Dispatch", "Handler", "Housekeeping", "Job", "News", "Operator", "Subsystem"]

#: a subscription to every kind the subsystem does not name itself
ANY = "*"
#: what takes one event of a kind it subscribed to (on the event loop: cheap, never blocking)
Handler = Callable[["Event"], None]

#: names who made a request, as the audit trail records it (the server's ``X-Watchd-Operator`` reading)
Operator = Callable[["web.Request"], str]


class Job(NamedTuple):
    """A periodic job: ``run`` every ``every_s`` seconds on the engine's scheduler (watchd.periodic)."""

    name: str
    every_s: float
    run: Callable[[], Awaitable[None]]


class Housekeeping(NamedTuple):
    """News: the engine's hourly prune of its state database, at ``now`` (the leader's only)."""

    now: float


class Subsystem(Protocol):
    #: its name: the key of its part of the status document, in logs
    name: str

    def subscriptions(self) -> Mapping[str, Handler]:
        """The event kinds it takes, each with its handler (:data:`ANY`: every kind it does not name): asked
        once, when the engine starts; each event it evaluates goes, before the rules, to the handlers of its
        kind, in the subsystems' order."""
        ...

    def news(self) -> Mapping[type, Callable[[Any], None]]:
        """What it takes of the engine's own news, by type, each with its handler: a rule's decision
        (``watchd.rules.decision.Decision``), an action's outcome (``watchd.model.action.ActionOutcome``), a
        node back in service through watchd (``watchd.model.action.NodeReturned``), a held drain released
        (``watchd.store.held.HeldReleased``), the hourly :class:`Housekeeping`. Asked once, when it starts."""
        ...

    def jobs(self) -> Sequence[Job]:
        """Its periodic jobs (asked once, when the engine starts)."""
        ...

    async def start(self) -> None:
        """Once the store, the rules and the executor are up; before the periodic jobs and serving."""
        ...

    async def stop(self) -> None:
        """After serving stopped and the accepted events were evaluated; bounded."""
        ...

    def routes(self, app: web.Application, operator: Operator) -> None:
        """Add its HTTP routes (reads need a viewer's token, POSTs an operator's: the auth middleware)."""
        ...

    def collectors(self) -> Sequence[Collector]:
        """Prometheus collectors to register in the engine's registry (besides the metrics it made there)."""
        ...

    def status(self) -> Mapping[str, Any] | None:
        """Its part of ``GET /api/v1/status`` (under its name), or None for none."""
        ...


class Component:
    """Defaults for a subsystem: it takes no events and no news, has no jobs, routes, collectors or status."""

    name = ""

    def subscriptions(self) -> Mapping[str, Handler]:
        return {}

    def news(self) -> Mapping[type, Callable[[Any], None]]:
        return {}

    def observe(self, event: Event) -> None:
        """One event to the handler it subscribed for its kind, if any, as the engine delivers it (for tests
        and tools that feed a subsystem by hand; the engine uses its :class:`Dispatch` table)."""
        subscribed = vars(self).get("_subscribed")
        if subscribed is None:  # asked once, as the engine asks
            subscribed = vars(self)["_subscribed"] = dict(self.subscriptions())
        handler = subscribed.get(event.kind) or subscribed.get(ANY)
        if handler is not None:
            handler(event)

    def jobs(self) -> Sequence[Job]:
        return ()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def routes(self, app: web.Application, operator: Operator) -> None:
        return None

    def collectors(self) -> Sequence[Collector]:
        return ()

    def status(self) -> Mapping[str, Any] | None:
        return None


class Dispatch:
    """The engine's event dispatch, built once from the subsystems' subscriptions: kind -> the handlers that
    take it, in the subsystems' order (a subsystem's own handler for the kind, else its :data:`ANY` one)."""

    __slots__ = ("_any", "_table")

    def __init__(self, table: Mapping[str, tuple[Handler, ...]], any_kind: tuple[Handler, ...]) -> None:
        self._table = dict(table)
        self._any = any_kind

    @classmethod
    def of(cls, subsystems: Sequence[Subsystem]) -> Dispatch:
        declared = [s.subscriptions() for s in subsystems]
        kinds = {kind for subs in declared for kind in subs if kind != ANY}
        table = {
            kind: tuple(h for subs in declared if (h := subs.get(kind) or subs.get(ANY)) is not None)
            for kind in kinds
        }
        return cls(table, tuple(subs[ANY] for subs in declared if ANY in subs))

    def handlers(self, kind: str) -> tuple[Handler, ...]:
        """Who takes an event of ``kind`` (a kind nobody named: the :data:`ANY` subscribers)."""
        return self._table.get(kind, self._any)

    @property
    def table(self) -> Mapping[str, tuple[Handler, ...]]:
        """kind -> its handlers, for every kind some subsystem named (the rest go to the ANY ones)."""
        return self._table


class News:
    """The engine's news to the subsystems that asked for it, by type; built once, as :class:`Dispatch`."""

    __slots__ = ("_table",)

    def __init__(self, subsystems: Sequence[Subsystem]) -> None:
        table: dict[type, list[Callable[[Any], None]]] = {}
        for subsystem in subsystems:
            for kind, handler in subsystem.news().items():
                table.setdefault(kind, []).append(handler)
        self._table = {kind: tuple(handlers) for kind, handlers in table.items()}

    def publish(self, item: object) -> None:
        """``item`` to each subsystem that asked for its type, in their order."""
        for handler in self._table.get(type(item), ()):
            handler(item)
