"""Integrations built from the engine's config by name.

A scheduler is a package under ``watchd/integrations/`` with a function ``scheduler_from_settings(section)``,
one entry here, and its config section: a :class:`~watchd.integrations.settings.SchedulerSettings` in the
package's ``settings.py`` (pydantic only: the config loads without the integration), and a field of that
type in :class:`~watchd.config.EngineConfig` named like the entry (``slurm:``, ``kubernetes:``, ``fake:``).
Every enabled section is built; several are composed by the routing scheduler
(:mod:`watchd.integrations.routing`) along the config's ``schedulers:`` routes. A package is imported only
when its scheduler is enabled (the Kubernetes client is not loaded for a Slurm engine).

Leadership is built here too, as its own object: the engine starts and stops it, the action pipeline asks it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Protocol, cast

from prometheus_client.registry import Collector

from watchd.errors import ConfigError
from watchd.integrations.base import Scheduler
from watchd.integrations.kubernetes.settings import KubernetesConfig
from watchd.integrations.leadership import Leadership
from watchd.integrations.settings import SchedulerRoute, SchedulerSettings
from watchd.store.settings import StateConfig

#: scheduler name (its config section) -> "module:function" building it from that section
SCHEDULERS: Mapping[str, str] = {
    "slurm": "watchd.integrations.slurm.scheduler:scheduler_from_settings",
    "kubernetes": "watchd.integrations.kubernetes.scheduler:scheduler_from_settings",
    "fake": "watchd.integrations.fake.scheduler:scheduler_from_settings",
}


class IntegrationsConfig(Protocol):
    """What the registry reads of the engine's config (:class:`watchd.config.EngineConfig`, which composes
    the sections above this module)."""

    @property
    def schedulers(self) -> list[SchedulerRoute]: ...
    @property
    def state(self) -> StateConfig: ...
    @property
    def kubernetes(self) -> KubernetesConfig: ...
    def scheduler_settings(self) -> dict[str, SchedulerSettings]: ...


class ElectedLeadership(Leadership, Protocol):
    """Leadership won in an election: it campaigns from ``start()`` until ``stop()`` (which hands the lead
    over when it holds it); the engine owns that lifecycle."""

    is_leader: bool

    def start(self) -> None: ...

    async def stop(self) -> None: ...


def builder(name: str) -> Callable[[SchedulerSettings], Scheduler]:
    """The function building scheduler ``name`` from its config section; ConfigError for an unknown name."""
    target = SCHEDULERS.get(name)
    if target is None:
        raise ConfigError(f"unknown scheduler {name!r} (known: {', '.join(sorted(SCHEDULERS))})")
    module, _, function = target.partition(":")
    return cast(Callable[[SchedulerSettings], Scheduler], getattr(importlib.import_module(module), function))


def collectors(config: IntegrationsConfig) -> list[Collector]:
    """The integrations' own metrics for the engine's registry: ``watchd_slurm_calls_total`` (how often
    watchd asks Slurm) when Slurm is enabled."""
    slurm = config.scheduler_settings().get("slurm")
    if slurm is None or not slurm.enabled:
        return []
    from watchd.integrations.slurm.calls import SlurmCallsCollector

    return [SlurmCallsCollector()]


def build_scheduler(config: IntegrationsConfig) -> Scheduler | None:
    """The configured schedulers: none, one, or several routed by node name."""
    built: dict[str, Scheduler] = {
        name: builder(name)(settings)
        for name, settings in config.scheduler_settings().items()
        if settings.enabled
    }
    if not config.schedulers:
        return next(iter(built.values()), None)
    from watchd.integrations.routing.scheduler import Route, RoutedScheduler

    routes = [Route(built[r.scheduler], tuple(r.nodes)) for r in config.schedulers]
    if len(routes) == 1 and routes[0].nodes == ("*",):
        return routes[0].scheduler
    return RoutedScheduler(routes)


def build_leadership(config: IntegrationsConfig) -> ElectedLeadership | None:
    """The elector when engine replicas elect a leader: the database lease with a shared PostgreSQL store
    (``state.postgres.leader_election``), the Kubernetes Lease (``kubernetes.leader_election``);
    None for a lone engine (it always leads)."""
    pg = config.state.postgres
    if config.state.kind == "postgres" and pg.leader_election.enabled:
        from watchd.integrations.dblease import lease_from_settings

        dsn, password = pg.resolve()
        le = pg.leader_election
        return lease_from_settings(
            dsn,
            password,
            name=le.lease_name,
            identity=le.identity,
            lease_duration_s=le.lease_duration_s,
            renew_deadline_s=le.renew_deadline_s,
            retry_period_s=le.retry_period_s,
            connect_timeout_s=pg.connect_timeout_s,
        )
    if not config.kubernetes.leader_election.enabled:
        return None
    from watchd.integrations.kubernetes.lease import elector_from_settings

    return elector_from_settings(config.kubernetes)
