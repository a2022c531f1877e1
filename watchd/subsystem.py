"""The engine as a list of subsystems, in the spirit of gpud's components: each part of the engine that is
more than the rules and the actions (the detectors, reliability accounting, the fleet view and its hot spares,
the active checks, the usage observations) is one object behind this small lifecycle protocol, and the engine
composes the list once and loops over it: every event it evaluates is shown to each subsystem's
:meth:`~Subsystem.observe`; their periodic jobs go on the engine's APScheduler; their HTTP routes are added
under the server's auth middleware; their Prometheus collectors are registered; their part of the status
document is read; they are started in order and stopped in reverse.

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

__all__ = ["Component", "Job", "Operator", "Subsystem"]

#: names who made a request, as the audit trail records it (the server's ``X-Watchd-Operator`` reading)
Operator = Callable[["web.Request"], str]


class Job(NamedTuple):
    """A periodic job: ``run`` every ``every_s`` seconds on the engine's scheduler (watchd.periodic)."""

    name: str
    every_s: float
    run: Callable[[], Awaitable[None]]


class Subsystem(Protocol):
    #: its name: the key of its part of the status document, in logs
    name: str

    def observe(self, event: Event) -> None:
        """Every event the engine evaluates, before the rules (on the event loop: cheap, never blocking)."""
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
    """Defaults for a subsystem: it observes nothing, has no jobs, routes, collectors or status."""

    name = ""

    def observe(self, event: Event) -> None:
        return None

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
