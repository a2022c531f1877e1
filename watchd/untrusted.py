"""Reading files that a cluster's users control: a job's output, a pod's log, a Flight Recorder dump, a
check's output. The daemons that read them may run as root; the file's path, type and content are the
user's choice.

Every such read goes through :func:`open_untrusted`:

- the path is opened with ``O_PATH | O_NOFOLLOW`` first, which opens nothing: no device is opened (opening
  ``/dev/watchdog`` arms a reboot), no FIFO blocks, a symlink as the last component is refused;
- only a regular file is read: FIFOs, devices, sockets and folders are refused;
- where the reader knows whose file it must be (the job's user), a file owned by anyone else is refused, so a
  link higher up the path into a place the user could not read leads nowhere;
- the file is then opened for reading through ``/proc/self/fd``: the same inode that was checked, whatever
  happened to the path meanwhile.

Reads are bounded (:func:`read_bounded`): a file that grew after its size was looked at is still read no
further than the limit. Blocking calls: run them off the event loop (:data:`FILE_IO`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["FILE_IO", "Refused", "open_untrusted", "read_bounded"]

#: the threads that open and read users' files: a hung file system stalls only these, not the daemon's loop
#: or its other worker threads
FILE_IO = ThreadPoolExecutor(max_workers=4, thread_name_prefix="watchd-user-files")

_CHUNK = 1 << 20


class Refused(Exception):
    """A file not read, and why. ``reason`` is a short label for metrics: ``missing``, ``symlink``,
    ``not_regular``, ``owner``, ``too_large``, ``unreadable``."""

    def __init__(self, path: Path | str, reason: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = str(path)
        self.reason = reason
        self.detail = detail


def open_untrusted(path: Path | str, *, owners: Collection[int] | None = None) -> int:
    """A file descriptor open for reading on ``path``, a regular file owned by one of ``owners`` (anyone when
    None); :class:`Refused` otherwise. The caller closes it."""
    try:
        handle = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise Refused(path, "missing", "no such file") from None
        raise Refused(path, "unreadable", exc.strerror or str(exc)) from None
    try:
        st = os.fstat(handle)
        if stat.S_ISLNK(st.st_mode):
            raise Refused(path, "symlink", "a symbolic link (not followed)")
        if not stat.S_ISREG(st.st_mode):
            raise Refused(path, "not_regular", f"not a regular file ({_kind(st.st_mode)})")
        if owners is not None and st.st_uid not in owners:
            wanted = ", ".join(str(u) for u in sorted(owners))
            raise Refused(path, "owner", f"owned by uid {st.st_uid}, not by {wanted}")
        try:
            flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
            return os.open(f"/proc/self/fd/{handle}", flags)
        except OSError as exc:
            raise Refused(path, "unreadable", exc.strerror or str(exc)) from None
    finally:
        os.close(handle)


def read_bounded(fd: int, limit: int, path: Path | str) -> bytes:
    """Everything from the file's current offset to its end, or :class:`Refused` (``too_large``) when that is
    more than ``limit`` bytes: the file is read, not its size believed."""
    parts: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        total += len(chunk)
        if total > limit:
            raise Refused(path, "too_large", f"more than {limit} bytes")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return "not a file"
