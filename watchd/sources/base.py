"""The log-source interface, and a fake with ``inject_log`` for tests, the demo and a fake GPU's kernel log.

A source yields lines; the agent turns some into events and ships them. Acknowledgement is part of the
interface: the agent calls :meth:`LogSource.hold` for each line an event was read from and
:meth:`LogSource.ack` once the shipper delivered that event (or the engine refused it for good), so a source
that can read again after a restart (kmsg, by sequence number) resumes before what was not delivered yet.
Sources that have nothing to acknowledge inherit the no-ops of :class:`NothingToAcknowledge`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from watchd.clock import Clock, SystemClock


@dataclass(frozen=True, slots=True)
class LogLine:
    """One kernel-log line as a watcher saw it."""

    text: str
    time: float  # when it was observed (the kernel's timestamp where the source has one)
    key: str  # identifies the line at its source, stable across re-reads: the base of the event id
    seq: int | None = None  # the kmsg record's sequence number
    job: str | None = None  # the job whose output the line is (Slurm output files, pod logs)
    #: the kernel wrote it (kmsg facility 0, journald _TRANSPORT=kernel), or the source is trusted by config
    #: (a file with ``trust: any-writer``); an untrusted line is never Xid evidence (docs/security.md)
    trusted: bool = True
    #: read from a file that gathers the output of a job's tasks on all its nodes (a Slurm batch job's
    #: output): the line is not this node's own (watchd.detect.attribution)
    gathered: bool = False


class LogSource(Protocol):
    name: str

    def lines(self) -> AsyncIterator[LogLine]:
        """Lines as they appear, forever; cancellation stops it."""
        ...

    def hold(self, line: LogLine) -> None:
        """An event read from ``line`` waits for delivery: until acknowledged, a restart reads it again."""
        ...

    def ack(self, line: LogLine) -> None:
        """The event read from ``line`` was delivered (or refused for good)."""
        ...


class NothingToAcknowledge:
    """For sources that cannot read a line again after a restart: holding and acknowledging do nothing."""

    def hold(self, line: LogLine) -> None:
        pass

    def ack(self, line: LogLine) -> None:
        pass


class FakeLogSource(NothingToAcknowledge):
    """A log source fed by the test: ``inject_log("NVRM: Xid ...")``."""

    def __init__(self, name: str = "fake", clock: Clock | None = None) -> None:
        self.name = name
        self._clock = clock or SystemClock()
        self._queue: asyncio.Queue[LogLine] = asyncio.Queue()
        self._seq = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None

    def inject_log_threadsafe(self, text: str) -> None:
        """``inject_log`` from another thread (a fake GPU driver writing its kernel lines)."""
        if self._loop is None:
            self.inject_log(text)
        else:
            self._loop.call_soon_threadsafe(self.inject_log, text)

    def inject_log(self, text: str) -> None:
        for line in text.splitlines():
            self._queue.put_nowait(LogLine(line, self._clock.now(), f"{self.name}:{next(self._seq)}"))

    async def lines(self) -> AsyncIterator[LogLine]:
        self._loop = asyncio.get_running_loop()
        while True:
            yield await self._queue.get()
