"""Flight Recorder dumps, read safely and summarized per rank and process group. Pure.

PyTorch writes a rank's dump on a watchdog timeout when ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` and the trace buffer
is on (``TORCH_NCCL_TRACE_BUFFER_SIZE`` / ``TORCH_FR_BUFFER_SIZE``), to ``<prefix><rank>`` where the prefix is
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` (``TORCH_FR_DUMP_TEMP_FILE`` in newer versions; default
``/tmp/nccl_trace_rank_``). That file is a **pickle** (format version 2.x: ``version``, ``pg_config``,
``pg_status``, ``entries``); the same content as JSON comes only from ``_dump_fr_trace_json`` (2.5+:
``_dump_nccl_trace_json``), which a job or its launcher may call itself.

A job's file is never unpickled: :func:`load_dump` reads JSON as JSON and a pickle with an unpickler whose
``find_class`` refuses every global, so only the protocol's own basic types (dict, list, tuple, str, bytes,
int, float, bool, None) can be built — no code runs, no object of any class is made. Files are read up to
:data:`MAX_DUMP_BYTES`; what is summarized is bounded by :data:`MAX_PGS` process groups.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from watchd.model.trainlog import MAX_TEXT, FlightRecord

__all__ = ["MAX_DUMP_BYTES", "MAX_PGS", "DumpError", "load_dump", "summarize"]

MAX_DUMP_BYTES = 64 << 20  # a 20,000-entry trace with stacks is a few MiB
MAX_PGS = 64


class DumpError(ValueError):
    """A dump that cannot be read safely or is not a Flight Recorder dump; the message says why."""


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise DumpError(f"refused: the dump references {module[:64]}.{name[:64]} (only basic types are read)")

    def persistent_load(self, pid: Any) -> Any:
        raise DumpError("refused: persistent ids")


@dataclass(frozen=True, slots=True)
class Dump:
    data: Mapping[str, Any]
    format: str  # json | pickle


def load_dump(data: bytes) -> Dump:
    """A dump's content; :class:`DumpError` when it is too large, neither JSON nor a safe pickle, or not a
    Flight Recorder dump."""
    if len(data) > MAX_DUMP_BYTES:
        raise DumpError(f"larger than {MAX_DUMP_BYTES} bytes")
    stripped = data.lstrip()
    if stripped[:1] == b"{":
        try:
            obj: Any = json.loads(stripped)
        except (ValueError, RecursionError) as exc:
            raise DumpError(f"not valid JSON: {str(exc)[:120]}") from exc
        fmt = "json"
    elif data[:1] == b"\x80":
        try:
            obj = _SafeUnpickler(io.BytesIO(data)).load()
        except DumpError:
            raise
        except (
            pickle.UnpicklingError,
            EOFError,
            ValueError,
            TypeError,
            KeyError,
            IndexError,
            RecursionError,
        ) as exc:
            raise DumpError(f"not a readable pickle: {type(exc).__name__}") from exc
        except MemoryError as exc:  # pragma: no cover - bounded by MAX_DUMP_BYTES
            raise DumpError("too large to read") from exc
        fmt = "pickle"
    else:
        raise DumpError("neither JSON nor a pickle")
    if not isinstance(obj, dict) or not isinstance(obj.get("entries", []), list):
        raise DumpError("not a Flight Recorder dump (no entries)")
    return Dump(obj, fmt)


def _seq(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) < 20:
        return int(value)
    return None


def _text(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    return text[:MAX_TEXT]


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
