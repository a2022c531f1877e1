"""``/dev/kmsg`` record parsing (pure: bytes in, :class:`KmsgRecord` out; never raises).

Each ``read()`` of ``/dev/kmsg`` returns one record::

    <prio>,<seq>,<usec>,<flags>[,<more>...];<message>\\n
     KEY=VALUE\\n
     KEY=VALUE\\n

``prio`` is ``facility << 3 | level``; ``seq`` a 64-bit sequence number (a gap means records were overwritten
before they were read: ``EPIPE``); ``usec`` the monotonic timestamp in microseconds; ``flags`` ``-``, ``c``
(continuation start) or ``+`` (continuation). The kernel escapes non-printable bytes (and ``\\``) in the
message and in the ``KEY=VALUE`` continuation lines as ``\\xNN``; they are unescaped here, so a multi-line
``printk`` comes back with real newlines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["KmsgRecord", "SeqTracker", "parse_kmsg_record"]


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    priority: int  # syslog level, 0 (emerg) .. 7 (debug)
    facility: int  # 0 = kernel
    seq: int
    usec: int
    flags: str
    message: str
    fields: Mapping[str, str] = field(default_factory=dict)


_HEADER_RE = re.compile(rb"([0-9]{1,10}),([0-9]{1,20}),([0-9]{1,20}),([^,;\n]*)(?:,[^;\n]*)?;")
_ESCAPE_RE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def _unescape(data: bytes) -> str:
    if b"\\x" in data:
        data = _ESCAPE_RE.sub(lambda m: bytes((int(m.group(1), 16),)), data)
    return data.decode("utf-8", errors="replace")


def parse_kmsg_record(data: bytes) -> KmsgRecord | None:
    """Parse one record as returned by one ``read()`` of ``/dev/kmsg``; None when it is malformed.

    Malformed means: no ``prio,seq,usec,flags;`` header. Continuation lines that do not start with a space or
    carry no ``=`` are skipped; a later ``KEY`` wins over an earlier one.
    """
    m = _HEADER_RE.match(data)
    if m is None:
        return None
    prio = int(m.group(1))
    body = data[m.end() :]
    message, _, tail = body.partition(b"\n")
    fields: dict[str, str] = {}
    for raw in tail.split(b"\n"):
        if not raw.startswith(b" "):
            continue
        key, eq, value = raw[1:].partition(b"=")
        if not eq or not key:
            continue
        fields[_unescape(key)] = _unescape(value)
    return KmsgRecord(
        priority=prio & 7,
        facility=prio >> 3,
        seq=int(m.group(2)),
        usec=int(m.group(3)),
        flags=m.group(4).decode("ascii", errors="replace"),
        message=_unescape(message),
        fields=fields,
    )


class SeqTracker:
    """Counts records lost between reads, from the gaps in their sequence numbers.

    ``observe`` returns how many records were skipped since the previous one: 0 for the first record, for
    consecutive ones and for a repeated one; a sequence number going backwards means the ring was reset
    (reboot, or another boot's log): 0, and counting starts again from it.
    """

    __slots__ = ("_last", "lost_total")

    def __init__(self) -> None:
        self._last: int | None = None
        self.lost_total = 0

    @property
    def last(self) -> int | None:
        """The highest sequence number seen since the last re-baseline, None before the first."""
        return self._last

    def observe(self, seq: int) -> int:
        last = self._last
        if last is None or seq < last:
            self._last = seq
            return 0
        if seq == last:
            return 0
        lost = seq - last - 1
        self._last = seq
        self.lost_total += lost
        return lost
