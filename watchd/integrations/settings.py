"""What every scheduler's config section shares (:class:`SchedulerSettings`, the base of ``slurm:``,
``kubernetes:``, ``fake:``) and the engine's ``schedulers:`` routes. Each scheduler's own section lives in
its package's ``settings.py``, which imports only pydantic and watchd's vocabulary: the config loads without
importing an integration."""

from __future__ import annotations

from pydantic import Field

from watchd.strict import Strict


class SchedulerSettings(Strict):
    """The config section of one scheduler integration: an ``EngineConfig`` field of this type, named as the
    scheduler is in :data:`watchd.integrations.registry.SCHEDULERS` and in ``schedulers[].scheduler``."""

    enabled: bool = False


class SchedulerRoute(Strict):
    """Which nodes one scheduler acts on (shell patterns on the node name); a node may match several."""

    scheduler: str  # a scheduler section of the engine config: slurm, kubernetes, fake
    nodes: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
