"""What the whole-fleet view (``watchd drains``) and the hot spares ask of a scheduler: one small
protocol, with a real implementation per scheduler (Slurm: ``sinfo``/``scontrol`` reservations;
Kubernetes: Node objects and a taint) and a faithful fake, chosen from :data:`FLEETS` by the scheduler's
name. Kept apart from :class:`~watchd.integrations.base.Scheduler`: a scheduler that has none still drains.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast, runtime_checkable

from watchd.integrations.base import SchedulerError
from watchd.model.fleet import FleetNode
from watchd.port import Verb, table

__all__ = ["FLEETS", "FLEET_VERBS", "FleetBackend", "fleet_backends"]


@runtime_checkable
class FleetBackend(Protocol):
    """The fleet as one scheduler sees it. Every call raises
    :class:`~watchd.integrations.base.SchedulerError` when the scheduler cannot be asked."""

    name: str

    async def fleet_nodes(self) -> list[FleetNode]:
        """Every node, with its partitions, state, reason, who set it and when; spares marked."""
        ...

    async def spares(self) -> dict[str, list[str]]:
        """Each partition's hot spares (watchd's reservation or taint), in the order they were taken."""
        ...

    async def set_spares(self, partition: str, nodes: Sequence[str]) -> None:
        """Make ``nodes`` the partition's spares (an empty list ends the reservation). A node running a job
        is refused by the scheduler (SchedulerError), never taken."""
        ...

    async def pending(self, jobs: Sequence[str]) -> set[str]:
        """Which of ``jobs`` (requeued by watchd) wait to start again: not yet running, not ended."""
        ...


def _spares_refused(why: str, partition: str, nodes: Sequence[str]) -> None:
    raise SchedulerError(why)


#: the fleet's verbs: a change to the spares is asked through the gate right before the call (refused, it
#: raises SchedulerError and touches nothing)
FLEET_VERBS = table(
    Verb("fleet_nodes"),
    Verb("spares"),
    Verb("pending"),
    Verb(
        "set_spares",
        changes=True,
        capability="reservations",
        what=lambda partition, nodes: f"spares of {partition}",
        refused=_spares_refused,
    ),
)

#: scheduler name -> "module:function" building its fleet backend from the scheduler object
FLEETS: Mapping[str, str] = {
    "slurm": "watchd.integrations.slurm.fleet:fleet_of",
    "kubernetes": "watchd.integrations.kubernetes.fleet:fleet_of",
    "fake": "watchd.integrations.fake.fleet:fleet_of",
}


def fleet_backends(scheduler: Any) -> list[FleetBackend]:
    """The fleet backends of a configured scheduler: its own, or one per route of a routed scheduler."""
    if scheduler is None:
        return []
    if isinstance(scheduler, FleetBackend):
        return [scheduler]
    routes = getattr(scheduler, "routes", None)
    if routes is not None:
        seen: dict[int, FleetBackend] = {}
        for route in routes:
            for backend in fleet_backends(route.scheduler):
                seen.setdefault(id(backend), backend)
        return list(seen.values())
    target = FLEETS.get(getattr(scheduler, "name", ""))
    if target is None:
        return []
    module, _, function = target.partition(":")
    build = cast(Callable[[Any], FleetBackend], getattr(importlib.import_module(module), function))
    return [build(scheduler)]
