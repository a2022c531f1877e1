"""Wake up when a directory changes (Linux inotify through libc), with a timed fallback.

Used by the file follower so that a new log line is seen at once instead of at the next poll. Where
inotify is not available (another OS, no libc, a watch limit reached), :class:`ChangeWaiter` just sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
from pathlib import Path

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name, use_errno=True)
        lib.inotify_init1  # noqa: B018 - probe that the symbol exists
    except (OSError, AttributeError):
        return None
    return lib


_LIBC = _libc()


class ChangeWaiter:
    """``await wait(timeout)`` returns when something in ``directory`` changed, or after ``timeout``."""

    def __init__(self, directory: Path) -> None:
        self.fd: int | None = None
        if _LIBC is None:
            return
        fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return
        if _LIBC.inotify_add_watch(fd, os.fsencode(directory), _MASK) < 0:
            os.close(fd)
            return
        self.fd = fd

    @property
    def active(self) -> bool:
        return self.fd is not None

    async def wait(self, timeout: float) -> None:
        if self.fd is None:
            await asyncio.sleep(timeout)
            return
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        # Not asyncio.wait_for: on Python 3.11 it returns the result when the change and a cancellation come
        # in the same turn of the loop, and the cancelled follower reads on (an agent that never stops).
        loop.add_reader(self.fd, wake)
        timer = loop.call_later(timeout, wake)
        try:
            await ready
        finally:
            timer.cancel()
            loop.remove_reader(self.fd)
        self._drain()

    def _drain(self) -> None:
        assert self.fd is not None
        with contextlib.suppress(BlockingIOError):
            while os.read(self.fd, 65536):
                pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
