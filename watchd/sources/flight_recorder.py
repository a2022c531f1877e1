"""Read the Flight Recorder dumps jobs on this node write (issue 19) and ship one event per rank and process
group: the last collective sequence enqueued, started and completed.

Watches folders (``sources.training.flight_recorder_dirs``: where the jobs'
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
or ``TORCH_FR_DUMP_TEMP_FILE`` prefix points) for files named ``<prefix><rank>``. A file is read once its size
held still for one poll, and again only when it changes. Files larger than the dump bound are counted and
skipped; a file that is not a dump, or would need more than basic types to unpickle, is counted in
:attr:`FlightRecorderSource.unreadable` (:mod:`watchd.trainlog.flight_recorder` never runs a job's code). The
job is the Slurm job whose id names the file's folder (``.../<jobid>/nccl_trace_rank_3``), else unknown.

Unlike the line sources it yields events (:class:`EventSource`); the agent ships them as it ships the rest.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Protocol

from watchd.clock import Clock, SystemClock
from watchd.logs import get_logger
from watchd.model.events import Event, stable_id
from watchd.trainlog.flight_recorder import MAX_DUMP_BYTES, DumpError, load_dump, summarize

__all__ = ["EventSource", "FlightRecorderSource"]

_log = get_logger("watchd.source.flight_recorder")
_MAX_FILES = 4096


class EventSource(Protocol):
    name: str

    def events(self) -> AsyncIterator[Event]:
        """Events as they are found, forever; cancellation stops it."""
        ...


class FlightRecorderSource:
    def __init__(
        self,
        node: str,
        dirs: Sequence[Path],
        *,
        prefix: str = "nccl_trace_rank_",
        poll_interval_s: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        self.name = "flight-recorder"
        self.node = node
        self.dirs = tuple(dirs)
        self.prefix = prefix
        self.poll_interval_s = poll_interval_s
        self._clock = clock or SystemClock()
        self._pattern = re.compile(re.escape(prefix) + r"(\d{1,9})$")
        self._seen: dict[Path, tuple[int, int]] = {}  # path -> (size, mtime_ns) read
        self._pending: dict[Path, tuple[int, int]] = {}  # path -> (size, mtime_ns) at the last poll
        self.unreadable = 0
        self.too_large = 0
        self.read = 0

    def _candidates(self) -> list[tuple[Path, int]]:
        out: list[tuple[Path, int]] = []
        for root in self.dirs:
            try:
                walker = list(os.walk(root))[:64]  # the folder and its job folders, one level of ids
            except OSError:
                continue
            for folder, _, files in walker:
                for name in files:
                    m = self._pattern.search(name)
                    if m is not None and len(out) < _MAX_FILES:
                        out.append((Path(folder) / name, int(m.group(1))))
        return out

    def scan(self) -> list[Event]:
        """One poll (blocking: run in a thread): the events of the dumps new or changed, and stable."""
        events: list[Event] = []
        present = set()
        for path, rank in self._candidates():
            present.add(path)
            try:
                st = path.stat()
            except OSError:
                continue
            sig = (st.st_size, st.st_mtime_ns)
            if self._seen.get(path) == sig:
                continue
            if self._pending.get(path) != sig:
                self._pending[path] = sig  # changed since the last poll: wait until it holds still
                continue
            self._pending.pop(path, None)
            self._seen[path] = sig
            if st.st_size > MAX_DUMP_BYTES:
                self.too_large += 1
                _log.warning("flight_recorder_dump_too_large", path=str(path), size=st.st_size)
                continue
            try:
                dump = load_dump(path.read_bytes())
            except (OSError, DumpError) as exc:
                self.unreadable += 1
                _log.warning("flight_recorder_dump_unreadable", path=str(path), error=str(exc)[:200])
                continue
            parent = path.parent.name
            job = f"slurm:{parent}" if parent.isdigit() else None
            records, left_out = summarize(dump, rank=rank, job=job, path=str(path))
            if left_out:
                _log.warning("flight_recorder_groups_left_out", path=str(path), count=left_out)
            self.read += 1
            when = st.st_mtime_ns / 1e9
            for rec in records:
                events.append(
                    rec.to_event(
                        id=stable_id(self.node, "flight_recorder", path, sig, rec.pg),
                        node=self.node,
                        source=self.name,
                        time=when,
                    )
                )
        for gone in [p for p in self._seen if p not in present]:
            del self._seen[gone]
        for gone in [p for p in self._pending if p not in present]:
            del self._pending[gone]
        return events

    async def events(self) -> AsyncIterator[Event]:
        while True:
            for event in await asyncio.to_thread(self.scan):
                yield event
            await asyncio.sleep(self.poll_interval_s)
