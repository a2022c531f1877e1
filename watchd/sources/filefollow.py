"""Follow a log file like ``tail -F``: start at the end, survive rotation and truncation."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

from watchd.clock import Clock, SystemClock
from watchd.logs import get_logger
from watchd.sources.base import LogLine, NothingToAcknowledge
from watchd.sources.inotify import ChangeWaiter

_log = get_logger("watchd.source.file")
_CHUNK = 1 << 20
_MAX_LINE = 1 << 20


class FileFollowSource(NothingToAcknowledge):
    """Wakes on inotify events of the file's folder, and polls every ``poll_interval`` seconds as well (the
    only way where inotify is not available, e.g. on some network filesystems).

    Rotation (a new inode at the path) drains the rest of the old file, then reads the new one from its
    start; truncation restarts at offset 0. A missing file is waited for. Each line's key is its inode and
    byte offset, so a line re-read after a restart keeps its id."""

    def __init__(
        self,
        path: Path,
        poll_interval: float = 0.5,
        *,
        from_start: bool = False,
        clock: Clock | None = None,
        trusted: bool = False,
    ) -> None:
        """``trusted``: whoever can write the file is trusted to write only the kernel's lines."""
        self.trusted = trusted
        self.path = path
        self.name = f"file:{path}"
        self._interval = poll_interval
        self._from_start = from_start
        self._clock = clock or SystemClock()
        self.errors = 0

    async def lines(self) -> AsyncIterator[LogLine]:
        fh = None
        inode = -1
        offset = 0
        pending = b""
        first = True
        rotated = False
        missing_logged = False
        waiter = ChangeWaiter(self.path.parent)
        try:
            while True:
                if fh is None:
                    try:
                        fh = open(self.path, "rb")  # noqa: SIM115 - kept open across iterations
                    except OSError as exc:
                        if not missing_logged:
                            _log.warning("log_file_unavailable", path=str(self.path), error=exc.strerror)
                            missing_logged = True
                        first = False  # a file that appears later is read from its start
                        await waiter.wait(self._interval)
                        continue
                    missing_logged = False
                    st = os.fstat(fh.fileno())
                    inode = st.st_ino
                    offset = st.st_size if first and not self._from_start else 0
                    fh.seek(offset)
                    pending = b""
                    first = False
                chunk = fh.read(_CHUNK)
                if chunk:
                    now = self._clock.now()
                    data = pending + chunk
                    *complete, pending = data.split(b"\n")
                    overlong = b""
                    if len(pending) > _MAX_LINE:  # no newline in sight: pass it on in pieces, never grow
                        overlong, pending = pending, b""
                    line_start = offset
                    for raw in complete:
                        yield LogLine(
                            raw.decode("utf-8", "replace"), now, f"{inode}:{line_start}", trusted=self.trusted
                        )
                        line_start += len(raw) + 1
                    if overlong:
                        yield LogLine(
                            overlong.decode("utf-8", "replace"),
                            now,
                            f"{inode}:{line_start}",
                            trusted=self.trusted,
                        )
                        line_start += len(overlong)  # no newline was consumed
                    offset = line_start
                    continue
                # At the end of the file: has it been rotated or truncated?
                if rotated:
                    fh.close()
                    fh, rotated = None, False  # the old file is read to its end: open the new one
                    continue
                try:
                    current: os.stat_result | None = os.stat(self.path)
                except OSError:
                    current = None
                if current is not None and current.st_ino != inode:
                    rotated = True  # read what was written to the old file meanwhile, then switch
                    continue
                if current is not None and current.st_size < offset + len(pending):
                    _log.info("log_file_truncated", path=str(self.path))
                    fh.seek(0)
                    offset, pending = 0, b""
                    continue
                await waiter.wait(self._interval)
        finally:
            waiter.close()
            if fh is not None:
                fh.close()
