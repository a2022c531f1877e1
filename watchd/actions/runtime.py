"""What handlers run with: the scheduler (and its drain rounds), the alert keeper, the webhook sender."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from watchd.actions.alerting import AlertKeeper
from watchd.actions.drain_batcher import DrainBatcher
from watchd.actions.outcome import ActionResult, Outcome
from watchd.clock import Clock
from watchd.engine.metrics import EngineMetrics
from watchd.integrations.base import Scheduler, SchedulerError
from watchd.integrations.webhook.sender import WebhookSender

SchedulerCall = Callable[[Scheduler, DrainBatcher], Awaitable[ActionResult]]


@dataclass(frozen=True, slots=True)
class Runtime:
    scheduler: Scheduler | None
    batcher: DrainBatcher | None
    alerts: AlertKeeper
    webhooks: WebhookSender | None
    clock: Clock
    metrics: EngineMetrics
    generator_url: str = ""

    async def scheduled(self, kind: str, call: SchedulerCall) -> ActionResult:
        """One call to the scheduler, timed (``watchd_action_duration_seconds``); a SchedulerError is the
        outcome ``failed`` with its message."""
        if self.scheduler is None or self.batcher is None:
            return ActionResult(Outcome.NO_SCHEDULER, "no scheduler adapter is enabled")
        start = self.clock.monotonic()
        try:
            result = await call(self.scheduler, self.batcher)
        except SchedulerError as exc:
            result = ActionResult(Outcome.FAILED, str(exc))
        self.metrics.action_duration.labels(kind).observe(self.clock.monotonic() - start)
        return result
