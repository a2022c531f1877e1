"""Read the kernel ring buffer from ``/dev/kmsg``: one record per read(), resumable by sequence number.

On first start the reader seeks to the end (old messages were handled before, or by the boot itself). The
sequence number saved with the boot id is the last record whose events were delivered (records whose events
still wait in the agent's queue are held back): after a restart within the same boot the reader resumes
right after it, so nothing logged while the agent was down, or read but not yet shipped, is missed. A read
that fails with EPIPE means the ring overwrote records before they were read: the gap in sequence numbers is
how many, and it is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from watchd.clock import Clock, SystemClock
from watchd.logs import get_logger
from watchd.sources.base import LogLine
from watchd.sources.kmsg_record import SeqTracker, parse_kmsg_record

_log = get_logger("watchd.source.kmsg")
_READ_SIZE = 16384  # larger than the kernel's biggest record (8 KiB)
_SAVE_EVERY_S = 1.0


def current_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


#: the syslog facility of the kernel's own messages (LOG_KERN)
KERNEL_FACILITY = 0


class KmsgSource:
    def __init__(
        self,
        path: Path = Path("/dev/kmsg"),
        state_file: Path | None = None,
        *,
        clock: Clock | None = None,
        on_lost: Callable[[int], None] | None = None,
        opener: Callable[[], int] | None = None,
        boot_id: str | None = None,
    ) -> None:
        self.name = "kmsg"
        self.path = path
        self.state_file = state_file
        self._clock = clock or SystemClock()
        self._on_lost = on_lost or (lambda n: None)
        self._opener = opener or (lambda: os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        self._boot_id = boot_id or current_boot_id()
        self.malformed = 0
        self.lost = 0
        self.last_seq: int | None = None
        self._unsettled: set[int] = set()  # records whose events are not delivered yet

    # --- resume state -------------------------------------------------------------------------------

    def _load_resume_seq(self) -> int | None:
        if self.state_file is None:
            return None
        try:
            state = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            _log.warning("kmsg_state_unreadable", path=str(self.state_file), error=str(exc))
            return None
        if not isinstance(state, dict) or state.get("boot_id") != self._boot_id:
            return None  # another boot: its sequence numbers mean nothing now
        seq = state.get("seq")
        return seq if isinstance(seq, int) else None

    def hold(self, line: LogLine) -> None:
        """An event of the line's record waits for delivery: a restart must read that record again."""
        if line.seq is not None:
            self._unsettled.add(line.seq)

    def ack(self, line: LogLine) -> None:
        """The events of the line's record were delivered (or refused for good)."""
        if line.seq is not None:
            self._unsettled.discard(line.seq)

    @property
    def resume_seq(self) -> int | None:
        """The last record that needs no second reading: before the oldest one still waiting for delivery."""
        if self._unsettled:
            return min(self._unsettled) - 1
        return self.last_seq

    def save_state(self) -> None:
        seq = self.resume_seq
        if self.state_file is None or seq is None:
            return
        tmp = self.state_file.with_suffix(".tmp")
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"boot_id": self._boot_id, "seq": seq}))
            os.replace(tmp, self.state_file)
        except OSError as exc:
            _log.warning("kmsg_state_unwritable", path=str(self.state_file), error=exc.strerror)

    # --- reading ------------------------------------------------------------------------------------

    async def lines(self) -> AsyncIterator[LogLine]:
        fd = self._opener()
        resume_after = self._load_resume_seq()
        tracker = SeqTracker()
        try:
            with contextlib.suppress(OSError):  # not seekable (a socket in tests): read as it comes
                os.lseek(fd, 0, os.SEEK_SET if resume_after is not None else os.SEEK_END)
            if resume_after is not None:
                tracker.observe(resume_after)
                _log.info("kmsg_resuming", after_seq=resume_after)
            # kmsg timestamps are microseconds of CLOCK_MONOTONIC since boot.
            boot_wall = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
            last_save = time.monotonic()
            while True:
                try:
                    data = os.read(fd, _READ_SIZE)
                except BlockingIOError:
                    if self.last_seq is not None and time.monotonic() - last_save > _SAVE_EVERY_S:
                        self.save_state()
                        last_save = time.monotonic()
                    await _readable(fd)
                    continue
                except BrokenPipeError:
                    continue  # records were overwritten; the sequence gap on the next record counts them
                except OSError as exc:
                    if exc.errno == errno.EINVAL:  # record larger than our buffer: cannot happen, skip it
                        self.malformed += 1
                        continue
                    raise
                if not data:
                    await asyncio.sleep(0.1)  # EOF: only on a non-kmsg file
                    continue
                record = parse_kmsg_record(data)
                if record is None:
                    self.malformed += 1
                    _log.warning("kmsg_record_malformed", data=data[:200].decode("utf-8", "replace"))
                    continue
                if resume_after is not None and record.seq <= resume_after:
                    continue
                lost = tracker.observe(record.seq)
                if lost:
                    self.lost += lost
                    self._on_lost(lost)
                    _log.warning("kmsg_records_lost", count=lost, seq=record.seq)
                self.last_seq = record.seq
                when = boot_wall + record.usec / 1e6
                # facility 0 is the kernel's own; a process writing /dev/kmsg gets 1 (user) or what it asks
                # for, but never 0 (the kernel maps a requested 0 to 1): only the kernel's lines are evidence
                kernel = record.facility == KERNEL_FACILITY
                for i, text in enumerate(record.message.split("\n")):
                    key = f"{self._boot_id}:{record.seq}" + (f":{i}" if i else "")
                    yield LogLine(text, when, key, record.seq, trusted=kernel)
        finally:
            self.save_state()
            os.close(fd)


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        loop.remove_reader(fd)
