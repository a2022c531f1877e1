"""Follow a log file like ``tail -F``: start at the end, survive rotation and truncation — and a file chosen
by someone else (a job's output) costs the agent no more than it allows.

The file is opened and read through :mod:`watchd.untrusted` in its own threads, never on the event loop: a
symlink, FIFO, device or socket is refused, and so is a file of the wrong owner where the owner is known. Each
follower reads at most :attr:`ReadBudget.bytes_per_s` (shared by the files of one source), cuts lines at
``max_line`` bytes, and skips ahead — counted, logged — when more than ``max_backlog`` bytes wait unread (a
file written faster than anyone could read it, or a 50 GiB sparse file)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from watchd.clock import Clock, SystemClock
from watchd.logs import get_logger
from watchd.sources.base import LogLine, NothingToAcknowledge
from watchd.sources.inotify import ChangeWaiter
from watchd.untrusted import FILE_IO, Refused, open_untrusted

_log = get_logger("watchd.source.file")
_T = TypeVar("_T")
_CHUNK = 64 << 10
#: a log line longer than this is cut: what follows up to its newline is skipped (NCCL's longest are < 1 KiB)
MAX_LINE = 16 << 10
#: unread bytes beyond which a follower jumps to the end of the file
MAX_BACKLOG = 64 << 20
#: bytes and lines per second the files of one source may cost together
BYTES_PER_S = 8 << 20
LINES_PER_S = 20_000


@dataclass(slots=True)
class ReadBudget:
    """Bytes and lines per second shared by the followers of one source: past either, a follower waits for
    the next second."""

    bytes_per_s: int = BYTES_PER_S
    lines_per_s: int = LINES_PER_S
    _second: float = 0.0
    _bytes: int = 0
    _lines: int = 0
    _monotonic: Callable[[], float] = field(default=time.monotonic)

    def _roll(self) -> float:
        now = self._monotonic()
        if now - self._second >= 1.0:
            self._second, self._bytes, self._lines = now, 0, 0
        return now

    def wait_s(self) -> float:
        """How long to wait before reading more (0: read now)."""
        now = self._roll()
        spent = self._bytes >= self.bytes_per_s or self._lines >= self.lines_per_s
        return self._second + 1.0 - now if spent else 0.0

    def lines_left(self) -> int:
        self._roll()
        return max(0, self.lines_per_s - self._lines)

    def spend(self, n_bytes: int, n_lines: int = 0) -> None:
        self._bytes += n_bytes
        self._lines += n_lines


def _open(path: Path, owners: Collection[int] | None) -> tuple[int, os.stat_result]:
    fd = open_untrusted(path, owners=owners)
    return fd, os.fstat(fd)


def _read(fd: int, offset: int, n: int) -> tuple[bytes, int]:
    """Up to ``n`` bytes at ``offset``, and the file's size now."""
    return os.pread(fd, n, offset), os.fstat(fd).st_size


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path, follow_symlinks=False)
    except OSError:
        return None


class FileFollowSource(NothingToAcknowledge):
    """Wakes on inotify events of the file's folder, and polls every ``poll_interval`` seconds as well (the
    only way where inotify is not available, e.g. on some network filesystems).

    Rotation (a new inode at the path) drains the rest of the old file, then reads the new one from its
    start; truncation restarts at offset 0. A missing or refused file is waited for. Each line's key is its
    inode and byte offset, so a line re-read after a restart keeps its id."""

    def __init__(
        self,
        path: Path,
        poll_interval: float = 0.5,
        *,
        from_start: bool = False,
        clock: Clock | None = None,
        trusted: bool = False,
        owners: Collection[int] | None = None,
        budget: ReadBudget | None = None,
        on_refused: Callable[[str], None] | None = None,
        on_skipped: Callable[[int], None] | None = None,
        max_line: int = MAX_LINE,
        max_backlog: int = MAX_BACKLOG,
    ) -> None:
        """``trusted``: whoever can write the file is trusted to write only the kernel's lines. ``owners``:
        the uids the file may belong to (None: any). ``on_refused`` hears why a file was not read (once per
        reason in a row), ``on_skipped`` how many bytes were skipped unread."""
        self.trusted = trusted
        self.path = path
        self.name = f"file:{path}"
        self.owners = owners
        self._interval = poll_interval
        self._from_start = from_start
        self._clock = clock or SystemClock()
        self._budget = budget or ReadBudget()
        self._on_refused = on_refused or (lambda reason: None)
        self._on_skipped = on_skipped or (lambda n: None)
        self._max_line = max_line
        self._max_backlog = max_backlog
        self.errors = 0
        self.skipped_bytes = 0

    async def _io(self, fn: Callable[..., _T], *args: object) -> _T:
        return await asyncio.get_running_loop().run_in_executor(FILE_IO, fn, *args)

    async def lines(self) -> AsyncIterator[LogLine]:
        fd: int | None = None
        size = 0
        inode = -1
        offset = 0
        pending = b""
        cutting = False  # inside an overlong line: skip up to its newline
        first = True
        rotated = False
        refused_reason = ""
        waiter = ChangeWaiter(self.path.parent)
        try:
            while True:
                if fd is None:
                    try:
                        fd, st = await self._io(_open, self.path, self.owners)
                    except Refused as exc:
                        if exc.reason != refused_reason:
                            refused_reason = exc.reason
                            if exc.reason != "missing":
                                self._on_refused(exc.reason)
                            _log.warning("log_file_unavailable", path=str(self.path), error=exc.detail)
                        first = False  # a file that appears later is read from its start
                        await waiter.wait(self._interval)
                        continue
                    refused_reason = ""
                    inode = st.st_ino
                    offset = st.st_size if first and not self._from_start else 0
                    pending, cutting, first = b"", False, False
                assert fd is not None
                wait = self._budget.wait_s()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                if b"\n" in pending:  # lines held back by the budget: those first
                    chunk = b""
                else:
                    chunk, size = await self._io(_read, fd, offset + len(pending), _CHUNK)
                    self._budget.spend(len(chunk))
                if chunk or b"\n" in pending:
                    unread = size - offset - len(pending) - len(chunk)
                    if unread > self._max_backlog:
                        skipped = size - offset
                        self.skipped_bytes += skipped
                        self._on_skipped(skipped)
                        _log.warning("log_file_skipped_ahead", path=str(self.path), bytes=skipped)
                        offset, pending, cutting = size, b"", True  # resume at the next whole line
                        continue
                    now = self._clock.now()
                    data = pending + chunk
                    *complete, pending = data.split(b"\n")
                    room = self._budget.lines_left()
                    if len(complete) > room:  # the rest waits for the next second
                        complete, held = complete[:room], complete[room:]
                        pending = b"\n".join([*held, pending])
                    self._budget.spend(0, len(complete))
                    line_start = offset
                    for raw in complete:
                        if not cutting:
                            yield LogLine(
                                raw[: self._max_line].decode("utf-8", "replace"),
                                now,
                                f"{inode}:{line_start}",
                                trusted=self.trusted,
                            )
                        cutting = False
                        line_start += len(raw) + 1
                    if b"\n" not in pending and len(pending) > self._max_line:  # pass its start on
                        if not cutting:
                            yield LogLine(
                                pending[: self._max_line].decode("utf-8", "replace"),
                                now,
                                f"{inode}:{line_start}",
                                trusted=self.trusted,
                            )
                        line_start += len(pending)
                        pending, cutting = b"", True
                    offset = line_start
                    await asyncio.sleep(0)  # one chunk per turn of the loop
                    continue
                # At the end of the file: has it been rotated or truncated?
                if rotated:
                    os.close(fd)
                    fd, rotated = None, False  # the old file is read to its end: open the new one
                    continue
                current = await self._io(_stat, self.path)
                if current is not None and current.st_ino != inode:
                    rotated = True  # read what was written to the old file meanwhile, then switch
                    continue
                if size < offset + len(pending):
                    _log.info("log_file_truncated", path=str(self.path))
                    offset, pending, cutting = 0, b"", False
                    continue
                await waiter.wait(self._interval)
        finally:
            waiter.close()
            if fd is not None:
                os.close(fd)
