"""nccl-tests ``*_perf`` output (``all_reduce_perf`` and its siblings): the table per size, the summary lines
and the failure lines, for every layout the tests have printed.

Layouts seen in public outputs (tests/data/checks/README.md):

* newer builds: ``size count type redop root  time algbw busbw #wrong  time algbw busbw #wrong``
  (out-of-place, then in-place; ``#wrong`` is a count, ``N/A`` where not checked);
* older builds: ``error`` instead of ``#wrong`` (a float such as ``0e+00``, or ``N/A``), and without the
  ``root`` column, or without ``redop`` and ``root`` both;
* ``mpirun --tag-output`` prefixes (``[1,0]<stdout>:``).

A row is read from its end: the last eight fields are the two groups of four numbers, whatever precedes them
(so the parser does not depend on the header, which an excerpt or a truncated output may lack). The summary:
``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth : X [OK|FAILED]``. Failure lines:
``Test CUDA failure ...``, ``Test NCCL failure ...``, `` .. test pid N: Test failure ...`` and any line
saying ``FAILED``. Nothing here raises: an unreadable row is counted in ``bad_rows``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

__all__ = ["NcclReport", "NcclRow", "parse_nccl"]

_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?", re.IGNORECASE)
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([-+0-9.eE]+|nan|inf)\s*(OK|FAILED)?", re.IGNORECASE)
_FAILURE = re.compile(r"Test (?:CUDA |NCCL )?failure|\bFAILED\b")
_DEVICE = re.compile(r"^#\s*Rank\s+\d+\b.*\bdevice\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$")
#: a line is cut to this before it is looked at (a runaway line costs only itself)
_MAX_LINE = 4096
_MAX_ERRORS = 20


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True, slots=True)
class NcclRow:
    size: int  # bytes
    count: int
    type: str
    redop: str | None
    oop_time_us: float
    oop_algbw: float  # GB/s
    oop_busbw: float  # GB/s
    oop_wrong: int | None  # None: an "error" column (older builds) or N/A
    ip_time_us: float
    ip_algbw: float
    ip_busbw: float
    ip_wrong: int | None

    @property
    def wrong(self) -> int:
        return (self.oop_wrong or 0) + (self.ip_wrong or 0)


@dataclass(frozen=True, slots=True)
class NcclReport:
    rows: tuple[NcclRow, ...] = ()
    avg_busbw: float | None = None  # "# Avg bus bandwidth" (averaged over every size)
    out_of_bounds: int | None = None  # "# Out of bounds values"
    errors: tuple[str, ...] = ()  # failure lines, as printed (at most _MAX_ERRORS)
    devices: tuple[str, ...] = ()  # the GPU model of each rank ("NVIDIA H100 80GB HBM3")
    columns: str | None = None  # "wrong" | "error" | None (no header seen)
    bad_rows: int = 0

    @property
    def complete(self) -> bool:
        """The summary was printed (the test ran to its end)."""
        return self.avg_busbw is not None

    @property
    def wrong(self) -> int:
        return sum(r.wrong for r in self.rows)

    @property
    def largest(self) -> NcclRow | None:
        return max(self.rows, key=lambda r: r.size) if self.rows else None

    @property
    def busbw(self) -> float | None:
        """The bus bandwidth at the largest size measured (the best of out-of-place and in-place): what the
        links achieve, unlike the average, which small sizes dominate."""
        row = self.largest
        return None if row is None else max(row.oop_busbw, row.ip_busbw)

    @property
    def gpu_model(self) -> str | None:
        return self.devices[0] if self.devices else None

    def sizes(self, limit: int = 8) -> str:
        """The busbw of the largest ``limit`` sizes, ``size:busbw`` comma-separated (for the event)."""
        rows = sorted(self.rows, key=lambda r: r.size)[-limit:]
        return ",".join(f"{r.size}:{max(r.oop_busbw, r.ip_busbw):g}" for r in rows)


@dataclass
class _State:
    rows: list[NcclRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    columns: str | None = None
    avg: float | None = None
    oob: int | None = None
    bad: int = 0


def _wrong(token: str, columns: str | None) -> tuple[int | None, bool]:
    """A ``#wrong`` or ``error`` cell: (count, readable)."""
    if token.upper() == "N/A":
        return None, True
    if columns != "error" and token.isdigit():
        return int(token), True
    return None, _number(token) is not None  # an "error" column: a float, not a count


def _row(tokens: list[str], columns: str | None) -> NcclRow | None:
    if len(tokens) < 11 or not tokens[0].isdigit() or not tokens[1].isdigit():
        return None
    head, nums = tokens[:-8], tokens[-8:]
    if len(head) < 3:
        return None
    values = [_number(nums[i]) for i in (0, 1, 2, 4, 5, 6)]
    if any(v is None for v in values):
        return None
    oop_wrong, ok1 = _wrong(nums[3], columns)
    ip_wrong, ok2 = _wrong(nums[7], columns)
    if not (ok1 and ok2):
        return None
    t, a, b, t2, a2, b2 = (float(v) for v in values if v is not None)
    return NcclRow(
        size=int(head[0]),
        count=int(head[1]),
        type=head[2],
        redop=head[3] if len(head) > 3 and not head[3].lstrip("-").isdigit() else None,
        oop_time_us=t,
        oop_algbw=a,
        oop_busbw=b,
        oop_wrong=oop_wrong,
        ip_time_us=t2,
        ip_algbw=a2,
        ip_busbw=b2,
        ip_wrong=ip_wrong,
    )


def parse_nccl(text: str) -> NcclReport:
    st = _State()
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw[:_MAX_LINE]).strip()
        if not line:
            continue
        if line.startswith("#"):
            if (m := _AVG.match(line)) is not None:
                st.avg = _number(m.group(1))
                if m.group(2) and m.group(2).upper() == "FAILED":
                    st.errors.append(line)
            elif (m := _OOB.match(line)) is not None:
                st.oob = int(m.group(1))
                if m.group(2) and m.group(2).upper() == "FAILED":
                    st.errors.append(line)
            elif (m := _DEVICE.match(line)) is not None:
                st.devices.append(m.group(1))
            elif "size" in line and "count" in line:
                st.columns = "wrong" if "#wrong" in line else "error" if "error" in line else st.columns
            elif _FAILURE.search(line):
                st.errors.append(line)
            continue
        tokens = line.split()
        if tokens[0].isdigit():
            row = _row(tokens, st.columns)
            if row is None:
                st.bad += 1
            else:
                st.rows.append(row)
            continue
        if _FAILURE.search(line) and len(st.errors) < _MAX_ERRORS:
            st.errors.append(line)
    return NcclReport(
        rows=tuple(st.rows),
        avg_busbw=st.avg,
        out_of_bounds=st.oob,
        errors=tuple(st.errors[:_MAX_ERRORS]),
        devices=tuple(dict.fromkeys(st.devices)),
        columns=st.columns,
        bad_rows=st.bad,
    )
