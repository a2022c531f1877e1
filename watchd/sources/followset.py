"""A changing set of followed files merged into one stream of lines, each tagged with its job.

The Slurm job-output and pod-log sources decide which files to follow (the jobs running on the node); this
class follows each with :class:`~watchd.sources.filefollow.FileFollowSource` (from the end of a file already
written, through rotation and truncation) and releases it when asked — after ``grace_s``, so that the last
lines a dying job writes (the watchdog's timeout report is written right before the process exits) are still
read. Bounded: at most ``max_files`` files at once (a file beyond it is refused and counted in
:attr:`FollowSet.refused`), one read budget for all its files (bytes and lines per second), and a bounded
queue between the followers and the reader (a follower waits when it is full). Each file is opened as its
owner's: a file that does not belong to the job's user is not read (:mod:`watchd.untrusted`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from watchd.sources.base import LogLine
from watchd.sources.filefollow import FileFollowSource, ReadBudget

__all__ = ["FollowSet", "Followed"]

_QUEUE = 4096


@dataclass(frozen=True, slots=True)
class Followed:
    path: Path
    job: str | None
    owner: int | None = None  # the uid the file must belong to (the job's user); None: any
    gathered: bool = False  # the file gathers what the job's tasks print on all its nodes


class FollowSet:
    def __init__(
        self,
        *,
        max_files: int = 64,
        poll_interval_s: float = 0.5,
        grace_s: float = 5.0,
        transform: Callable[[LogLine], LogLine | None] | None = None,
        budget: ReadBudget | None = None,
        on_refused: Callable[[str], None] | None = None,
        on_skipped: Callable[[int], None] | None = None,
    ) -> None:
        """``on_refused`` hears the reason a file was not read, ``on_skipped`` how many bytes were skipped."""
        self.max_files = max_files
        self.budget = budget or ReadBudget()
        self._on_refused = on_refused
        self._on_skipped = on_skipped
        self.poll_interval_s = poll_interval_s
        self.grace_s = grace_s
        self._transform = transform
        self._queue: asyncio.Queue[LogLine] = asyncio.Queue(maxsize=_QUEUE)
        self._tasks: dict[Path, asyncio.Task[None]] = {}
        self._jobs: dict[Path, str | None] = {}
        self._releasing: dict[Path, asyncio.Task[None]] = {}
        self.refused = 0

    @property
    def followed(self) -> dict[Path, str | None]:
        """The files followed now (being released included), with their jobs."""
        return dict(self._jobs)

    def update(self, wanted: list[Followed]) -> None:
        """Follow exactly ``wanted`` from now on: new files are started, files no longer wanted released."""
        want = {w.path: w for w in wanted}
        for path, w in want.items():
            if path in self._releasing:
                self._releasing.pop(path).cancel()  # wanted again before its release
            if path in self._tasks:
                continue
            if len(self._tasks) >= self.max_files:
                self.refused += 1
                continue
            self._jobs[path] = w.job
            self._tasks[path] = asyncio.create_task(self._follow(w), name=f"follow-{path}")
        for path in [p for p in self._tasks if p not in want and p not in self._releasing]:
            self._releasing[path] = asyncio.create_task(self._release(path))

    async def _release(self, path: Path) -> None:
        await asyncio.sleep(self.grace_s)
        task = self._tasks.pop(path, None)
        self._jobs.pop(path, None)
        self._releasing.pop(path, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(self, followed: Followed) -> None:
        source = FileFollowSource(
            followed.path,
            self.poll_interval_s,
            owners=None if followed.owner is None else {followed.owner},
            budget=self.budget,
            on_refused=self._on_refused,
            on_skipped=self._on_skipped,
        )
        async for line in source.lines():
            tagged: LogLine | None = replace(
                line, key=f"{followed.path}:{line.key}", job=followed.job, gathered=followed.gathered
            )
            if self._transform is not None and tagged is not None:
                tagged = self._transform(tagged)
            if tagged is not None:
                await self._queue.put(tagged)

    async def lines(self) -> AsyncIterator[LogLine]:
        while True:
            yield await self._queue.get()

    async def lines_while(
        self, poll: Callable[[], Coroutine[Any, Any, None]], name: str
    ) -> AsyncIterator[LogLine]:
        """The lines, while ``poll`` (a source's loop that decides what to follow) runs beside them; on the
        way out the loop is stopped and every file released."""
        poller = asyncio.create_task(poll(), name=name)
        try:
            async for line in self.lines():
                yield line
        finally:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
            await self.close()

    async def close(self) -> None:
        tasks = [*self._tasks.values(), *self._releasing.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._jobs.clear()
        self._releasing.clear()
