"""Long work on the event loop, in slices: the work is a generator that yields between pieces (a job judged,
a page of GPUs), and :func:`run_sliced` drives it, serving the event loop whenever a slice has run its time
budget. Pure code yields and knows no clock; :func:`run_all` is the same work at once (tests, the blocking
forms).

The generator runs on the loop's own thread, so what it reads is never torn; between slices other
coroutines (ingest) may change the state it reads. Work that iterates a mutable container across a yield
iterates a copy (``list(d.items())``), and what it concludes at each step holds for the state it saw then.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["SLICE_S", "SliceStats", "Steps", "pause", "release", "run_all", "run_sliced"]

T = TypeVar("T")
Steps = Generator[None, None, T]  # yields between pieces of work, returns the result

SLICE_S = 0.02  # how long a slice may hold the event loop before it is served (a piece may overrun it)
PAUSE_S = 0.001  # between slices: a timer, so whatever is ready (requests, timers) runs before the next slice


async def pause() -> None:
    """Let the event loop serve what is ready before the work goes on. ``asyncio.sleep(0)`` would put the
    work back in the ready queue ahead of what becomes ready meanwhile (a request's data, a due timer): a
    request could then wait two or three slices; a short timer lets everything ready run first."""
    await asyncio.sleep(PAUSE_S)


def run_all(steps: Steps[T]) -> T:
    """Every step at once; the result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def release(items: dict[Any, Any], step: int) -> Steps[None]:
    """Let go of a big dict (emptied) ``step`` items at a time: freeing 100,000 job views at once takes the
    loop 20-150 ms. Only for a dict no one else holds."""
    while items:
        for _ in range(min(step, len(items))):
            items.popitem()
        yield


@dataclass(slots=True)
class SliceStats:
    """How a sliced run went: time computing (slices summed), slices, the longest (the loop held), and the
    wall time from start to end (computing, the pauses and what the loop served between slices)."""

    busy_s: float = 0.0
    slices: int = 0
    longest_s: float = 0.0
    wall_s: float = 0.0

    def add(self, slice_s: float) -> None:
        self.busy_s += slice_s
        self.slices += 1
        self.longest_s = max(self.longest_s, slice_s)


async def run_sliced(steps: Steps[T], budget_s: float = SLICE_S, stats: SliceStats | None = None) -> T:
    """Drive ``steps`` on the event loop, yielding to it once a slice has run ``budget_s``."""
    stats = stats if stats is not None else SliceStats()
    clock = time.perf_counter
    began = start = clock()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            end = clock()
            stats.add(end - start)
            stats.wall_s = end - began
            return done.value  # type: ignore[no-any-return]
        now = clock()
        if now - start >= budget_s:
            stats.add(now - start)
            await pause()
            start = clock()
