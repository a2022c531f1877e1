"""When a check's rounds fire (pure): its APScheduler trigger, and whether a round is due at once (the first
ever, or one the engine missed while it was away: one round, not one per missed slot)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from watchd.checks.params import CheckSpec

__all__ = ["trigger_for"]


def trigger_for(
    spec: CheckSpec, last: tuple[str, float, float | None] | None, now: float
) -> tuple[Any, datetime | None]:
    sched = spec.schedule
    assert sched is not None
    jitter = int(sched.jitter) or None
    now_dt = datetime.fromtimestamp(now, UTC)
    if sched.every is not None:
        start = datetime.fromtimestamp(last[1], UTC) if last is not None else now_dt
        trigger = IntervalTrigger(seconds=sched.every, start_date=start, jitter=jitter, timezone=UTC)
        due = last is None or last[1] + sched.every <= now
        return trigger, (now_dt if due else None)
    assert sched.cron is not None
    trigger = CronTrigger.from_crontab(sched.cron, timezone=UTC)
    trigger.jitter = jitter
    if last is not None:
        after = datetime.fromtimestamp(last[1], UTC) + timedelta(seconds=1)
        missed = trigger.get_next_fire_time(None, after)
        if missed is not None and missed <= now_dt:
            return trigger, now_dt  # the engine was away when a round was due: one round now
    return trigger, None
