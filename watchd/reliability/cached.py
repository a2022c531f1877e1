"""The reports the engine serves, built off the event loop and kept: at 100,000 nodes one report takes seconds
to read from the state database and build, and ``GET /api/v1/reliability`` used to build one per request on
the loop (2.2-2.7 s each).

* The fleet's report (no ``since``, no ``partition``): the one the periodic cycle built (every
  ``reliability.interval_s``); a request finds it at most ``max_age_s`` old, or builds it anew.
* A query's (``since``, ``partition``): kept ``max_age_s`` by the query as given (``since=30d`` is the same
  query a minute later), at most :data:`QUERIES_KEPT` of them.

One build at a time (a lock): requests that find the report stale while it is being built wait for that
build. Each report is kept with its document (:meth:`Report.to_dict`, made in the build's worker thread); the
document says its age (``report_age_s``)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from watchd.reliability.report import Report

__all__ = ["QUERIES_KEPT", "Built", "ReportCache"]

QUERIES_KEPT = 16


@dataclass(frozen=True, slots=True)
class Built:
    """A report and its document (made together, off the loop)."""

    report: Report
    doc: dict[str, Any]

    @classmethod
    def of(cls, report: Report) -> Built:
        return cls(report, report.to_dict())


Build = Callable[[], Awaitable[Built]]


class ReportCache:
    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self.current: Built | None = None  # the fleet's report
        self._queries: OrderedDict[tuple[str, str | None], Built] = OrderedDict()
        self._lock = asyncio.Lock()
        self.builds = 0  # reports built (for tests and the benchmark)

    def _fresh(self, built: Built | None, now: float) -> bool:
        return built is not None and now - built.report.now <= self.max_age_s

    async def rebuild(self, build: Build) -> Built:
        """The fleet's report built anew (the periodic cycle)."""
        async with self._lock:
            self.current = await self._run(build)
            return self.current

    async def fleet(self, now: float, build: Build) -> Built:
        """The fleet's report, built anew only when older than ``max_age_s`` at ``now``."""
        if self._fresh(self.current, now):
            assert self.current is not None
            return self.current
        async with self._lock:
            if not self._fresh(self.current, now):  # another request may have built it meanwhile
                self.current = await self._run(build)
            assert self.current is not None
            return self.current

    async def query(self, key: tuple[str, str | None], now: float, build: Build) -> Built:
        """A query's report (``key``: ``since`` as given, partition), built anew when older than
        ``max_age_s``."""
        found = self._queries.get(key)
        if found is not None and self._fresh(found, now):
            return found
        async with self._lock:
            found = self._queries.get(key)
            if found is None or not self._fresh(found, now):
                found = self._queries[key] = await self._run(build)
                while len(self._queries) > QUERIES_KEPT:
                    self._queries.popitem(last=False)
            self._queries.move_to_end(key)
            return found

    async def _run(self, build: Build) -> Built:
        self.builds += 1
        return await build()
