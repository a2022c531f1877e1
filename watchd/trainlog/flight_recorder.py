"""Flight Recorder dumps, read safely and summarized per rank and process group. Pure.

PyTorch writes a rank's dump on a watchdog timeout when ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` and the trace buffer
is on (``TORCH_NCCL_TRACE_BUFFER_SIZE`` / ``TORCH_FR_BUFFER_SIZE``), to ``<prefix><rank>`` where the prefix is
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` (``TORCH_FR_DUMP_TEMP_FILE`` in newer versions; default
``/tmp/nccl_trace_rank_``). That file is a **pickle** (format version 2.x: ``version``, ``pg_config``,
``pg_status``, ``entries``); the same content as JSON comes only from ``_dump_fr_trace_json`` (2.5+:
``_dump_nccl_trace_json``), which a job or its launcher may call itself.

A job's file is never unpickled: :func:`load_dump` reads JSON as JSON and a pickle with
:func:`~watchd.trainlog.plain_pickle.read_pickle`, a reader of its own that builds only the protocol's basic
types (dict, list, tuple, str, bytes, int, float, bool, None) — no code runs, no object of any class is made —
within fixed bounds of memory, opcodes, string and integer sizes and nesting, checked before anything is
built. Both formats are bounded alike: at most :data:`MAX_DUMP_BYTES` read, containers nested at most
:data:`MAX_DEPTH` deep, at most :data:`MAX_ENTRIES` entries and :data:`MAX_STATUS` process-group statuses.

:func:`summarize` never expands what a pickle shares (one list may be referenced a million times, or appended
to itself twice per level: a small graph, an exponential tree): it looks at the entries and their fields only,
never recurses, and turns only strings and numbers into text, cut to ``MAX_TEXT`` before anything longer is
built; a container is never converted to text. What it returns is bounded by :data:`MAX_PGS` process groups.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from watchd.model.trainlog import MAX_TEXT, FlightRecord
from watchd.trainlog.plain_pickle import LIMITS, PickleError, check_shape, read_pickle

__all__ = [
    "MAX_DEPTH",
    "MAX_DUMP_BYTES",
    "MAX_ENTRIES",
    "MAX_PGS",
    "MAX_STATUS",
    "DumpError",
    "load_dump",
    "summarize",
]

MAX_DUMP_BYTES = 64 << 20  # a 20,000-entry trace with 50-frame stacks is ~8 MiB as a pickle
MAX_DEPTH = LIMITS.max_depth  # containers nested in one another (a dump nests 6 deep)
MAX_ENTRIES = 250_000  # entries in a dump (TORCH_NCCL_TRACE_BUFFER_SIZE; 2,000 to 20,000 in practice)
MAX_STATUS = 65_536  # process groups in pg_status
MAX_PGS = 64  # process groups summarized
_INT64 = 1 << 63
_DIGITS = re.compile(r"-?[0-9]{1,19}")


class DumpError(ValueError):
    """A dump that cannot be read safely or is not a Flight Recorder dump; the message says why, ``reason``
    in a word: ``malformed`` (not JSON, not a pickle this reader reads, not a dump), ``code`` (the pickle
    would name a global or build an object) or ``limits`` (a bound exceeded)."""

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Dump:
    data: Mapping[str, Any]
    format: str  # json | pickle


def load_dump(data: bytes) -> Dump:
    """A dump's content; :class:`DumpError` when it is too large, neither JSON nor a safe pickle, or not a
    Flight Recorder dump."""
    if len(data) > MAX_DUMP_BYTES:
        raise DumpError(f"larger than {MAX_DUMP_BYTES} bytes", "limits")
    stripped = data.lstrip()
    try:
        if stripped[:1] == b"{":
            obj = _load_json(stripped)
            fmt = "json"
        elif data[:1] == b"\x80":
            obj = read_pickle(data)
            fmt = "pickle"
        else:
            raise DumpError("neither JSON nor a pickle")
    except PickleError as exc:
        raise DumpError(str(exc), exc.reason) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("entries", []), list):
        raise DumpError("not a Flight Recorder dump (no entries)")
    if len(obj.get("entries", [])) > MAX_ENTRIES:
        raise DumpError(f"refused: more than {MAX_ENTRIES} entries", "limits")
    status = obj.get("pg_status")
    if isinstance(status, dict) and len(status) > MAX_STATUS:
        raise DumpError(f"refused: more than {MAX_STATUS} process groups", "limits")
    return Dump(obj, fmt)


def _load_json(text: bytes) -> Any:
    # what json.loads would build, over-estimated from the text first: values are separated by commas and
    # colons, each costs at most 64 bytes (a pointer and a float, an int or a short string) and a container
    # at most 160 more (a dict with its first keys); the text's characters at most 1 byte each, 4 where it is
    # not ASCII (measured on CPython 3.11: 0.55 to 0.95 of the estimate, real dumps and worst cases alike)
    values = text.count(b",") + text.count(b":") + 1
    containers = text.count(b"{") + text.count(b"[")
    estimate = 64 * values + 160 * containers + (1 if text.isascii() else 4) * len(text)
    if estimate > LIMITS.max_memory:
        raise DumpError(f"refused: would build ~{estimate >> 20} MiB of values", "limits")
    try:
        obj: Any = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise DumpError(f"not valid JSON: {str(exc)[:120]}") from None
    check_shape(obj, MAX_DEPTH)
    return obj


def _seq(value: object) -> int | None:
    """A sequence number: a 64-bit integer, or its decimal digits."""
    if type(value) is str and _DIGITS.fullmatch(value) is not None:
        value = int(value)
    if type(value) is int and -_INT64 <= value < _INT64:
        return value
    return None


def _text(value: object) -> str:
    """A string or a number as text, cut to ``MAX_TEXT``; anything else (a container, above all: a shared
    one can expand to more text than there is memory) is no text."""
    if type(value) is str:
        return value[:MAX_TEXT]
    if (type(value) is int and -_INT64 <= value < _INT64) or type(value) is float:
        return str(value)
    return ""


def summarize(
    dump: Dump, *, rank: int, job: str | None = None, path: str | None = None
) -> tuple[list[FlightRecord], int]:
    """One record per process group of ``dump`` (at most :data:`MAX_PGS`) and how many were left out.

    From ``pg_status`` (last enqueued / started / completed collective) where the dump has it; otherwise from
    the entries (the highest ``collective_seq_id`` per state). The pending collective is the oldest entry not
    completed."""
    data = dump.data
    entries = [e for e in data.get("entries", []) if isinstance(e, dict)]
    by_pg: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        pg = e.get("process_group")
        key = _text(pg[0]) if isinstance(pg, list | tuple) and pg else _text(e.get("pg_id", "0"))
        by_pg.setdefault(key, []).append(e)
    status = data.get("pg_status")
    status = status if isinstance(status, dict) else {}
    names = sorted(set(by_pg) | {_text(k) for k in status}, key=lambda k: (len(k), k))
    left_out = max(0, len(names) - MAX_PGS)
    version = _text(data.get("version", "")) or None
    out = []
    for pg in names[:MAX_PGS]:
        pg_entries = by_pg.get(pg, [])
        st = status.get(pg)
        st = st if isinstance(st, dict) else {}
        seqs = {
            state: max(
                (
                    s
                    for e in pg_entries
                    if e.get("state") == state and (s := _seq(e.get("collective_seq_id"))) is not None
                ),
                default=-1,
            )
            for state in ("scheduled", "started", "completed")
        }
        enqueued = _seq(st.get("last_enqueued_collective"))
        started = _seq(st.get("last_started_collective"))
        completed = _seq(st.get("last_completed_collective"))
        if enqueued is None:
            enqueued = max(seqs.values())
        if started is None:
            started = max(seqs["started"], seqs["completed"])
        if completed is None:
            completed = seqs["completed"]
        pending = [
            e
            for e in pg_entries
            if e.get("state") != "completed" and (_seq(e.get("collective_seq_id")) or -1) > completed
        ]
        first = min(pending, key=lambda e: _seq(e.get("collective_seq_id")) or 0) if pending else None
        out.append(
            FlightRecord(
                rank=rank,
                pg=pg,
                last_enqueued=enqueued,
                last_started=started,
                last_completed=completed,
                pending_op=_text(first.get("profiling_name", "")) or None if first else None,
                pending_seq=_seq(first.get("collective_seq_id")) if first else None,
                entries=len(pg_entries),
                format=dump.format,
                version=version,
                path=path[:MAX_TEXT] if path else None,
                job=job,
            )
        )
    return out, left_out
