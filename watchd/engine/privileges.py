"""Whether the scheduler lets this engine change the cluster, asked at start (a warning, a log line and the
``watchd_scheduler_privileged`` metric) and by ``watchd engine --check``: a drain that Slurm refuses is found
before the first Xid, not after it. Nothing changes on the cluster to find out."""

from __future__ import annotations

import math

from prometheus_client import Gauge

from watchd.integrations.base import Privileges, Scheduler, SchedulerError
from watchd.logs import get_logger

__all__ = ["privileges"]

_log = get_logger("watchd.engine")


async def privileges(scheduler: Scheduler, gauge: Gauge | None = None) -> Privileges:
    """The scheduler's answer, logged (a warning when it refuses or cannot tell) and set on ``gauge`` (1, 0,
    NaN when it could not tell)."""
    try:
        answer = await scheduler.privileges()
    except SchedulerError as exc:
        answer = Privileges(None, f"could not ask {scheduler.name}: {exc}")
    if answer.allowed:
        _log.info("scheduler_privileges", scheduler=scheduler.name, detail=answer.detail)
    else:
        _log.warning(
            "scheduler_refuses" if answer.allowed is False else "scheduler_privileges_unknown",
            scheduler=scheduler.name,
            detail=answer.detail,
        )
    if gauge is not None:
        gauge.set(math.nan if answer.allowed is None else float(answer.allowed))
    return answer
