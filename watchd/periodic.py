"""Periodic work on APScheduler (the engine's loops, the Alertmanager re-send): each job runs every
``seconds`` (the first run one interval after start), never two runs of one job at once
(``max_instances=1``), late runs coalesced into one and never dropped for being late
(``misfire_grace_time=None``). A job that raises is logged and runs again at its next time. Stopping cancels
the runs in progress and waits for them, bounded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from watchd.logs import get_logger

_log = get_logger("watchd.periodic")

Job = Callable[[], Awaitable[None]]


class Periodic:
    def __init__(self) -> None:
        self._scheduler: Any = AsyncIOScheduler(
            timezone=UTC,
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None},
        )
        self._scheduler.add_listener(self._skipped, EVENT_JOB_MAX_INSTANCES)
        self._running: set[asyncio.Task[Any]] = set()

    def every(self, seconds: float, job: Job, name: str) -> None:
        """Run ``job`` every ``seconds`` once started (jobs may be added before or after)."""
        self._scheduler.add_job(self._run, "interval", seconds=seconds, args=(job, name), id=name, name=name)

    def schedule(self, trigger: Any, job: Job, name: str, next_run_time: datetime | None = None) -> None:
        """Run ``job`` on an APScheduler ``trigger`` (cron, or an interval with jitter: the active checks);
        ``next_run_time``: the first run (e.g. now, for a round a restart found missed)."""
        extra = {"next_run_time": next_run_time} if next_run_time is not None else {}
        self._scheduler.add_job(self._run, trigger, args=(job, name), id=name, name=name, **extra)

    def start(self) -> None:
        # APScheduler's own log lines would bypass structlog: the jobs log their failures themselves, and what
        # reaches APScheduler is only the cancellation of a run at stop (it logs that as an error)
        logging.getLogger("apscheduler").setLevel(logging.CRITICAL)
        self._scheduler.start()

    async def stop(self, timeout: float = 5.0) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)  # takes effect on the loop's next turn
        for task in self._running:
            task.cancel()
        if self._running:
            await asyncio.wait(list(self._running), timeout=timeout)
        await asyncio.sleep(0)

    async def _run(self, job: Job, name: str) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        try:
            await job()
        except Exception:  # a locked store or a broken scheduler call must not end the job's schedule
            _log.exception("periodic_job_failed", job=name)
        finally:
            if task is not None:
                self._running.discard(task)

    def _skipped(self, event: JobSubmissionEvent) -> None:
        _log.debug("periodic_job_still_running", job=event.job_id)

    def jobs(self) -> dict[str, float]:
        """Each job's name and interval in seconds (for tests and the log)."""
        return {
            j.id: j.trigger.interval.total_seconds()
            for j in self._scheduler.get_jobs()
            if hasattr(j.trigger, "interval")
        }

    def next_runs(self) -> dict[str, datetime | None]:
        """Each job's next run time."""
        return {j.id: j.next_run_time for j in self._scheduler.get_jobs()}
