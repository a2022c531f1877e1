"""``watchd xid``: decode Xid errors from log files or stdin, as an aligned table or JSON lines."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO, TextIO

from watchd.errors import UsageError
from watchd.model.xid import Xid
from watchd.xid.catalog import lookup
from watchd.xid.parser import XidParser, XidRecord

__all__ = ["mig_instance", "record_to_json", "render_table", "run_xid", "xid_of_record"]

_COLUMNS = ("PCI", "XID", "PID", "PROCESS", "MEANING", "ACTION")
_MIG_COLUMN = "MIG"  # after PCI, only when a record names a MIG instance
NO_XID_FOUND = "no Xid found"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    # keep the table one line per record whatever a process name contains
    return " ".join(str(value).split()) or "-"


def mig_instance(rec: XidRecord) -> str | None:
    """``GI 5 CI 2`` (or ``GI 5``) for an Xid the driver attributed to a MIG instance; None otherwise."""
    if rec.gpu_instance is None:
        return None
    gi = f"GI {rec.gpu_instance}"
    return gi if rec.compute_instance is None else f"{gi} CI {rec.compute_instance}"


def render_table(records: Sequence[XidRecord]) -> str:
    """An aligned table (PCI, XID, PID, PROCESS, MEANING, ACTION), one row per record; ``-`` for None. When
    a record names a MIG instance, a MIG column (``GI 5 CI 2``) follows PCI.

    No trailing newline; just the header row when ``records`` is empty.
    """
    mig = any(rec.gpu_instance is not None for rec in records)
    header = (_COLUMNS[0], _MIG_COLUMN, *_COLUMNS[1:]) if mig else _COLUMNS
    rows: list[tuple[str, ...]] = [header]
    for rec in records:
        info = lookup(rec.xid)
        values: tuple[object, ...] = (rec.xid, rec.pid, rec.process, info.meaning, info.action)
        first: tuple[object, ...] = (rec.pci_bus_id, mig_instance(rec)) if mig else (rec.pci_bus_id,)
        rows.append(tuple(_cell(v) for v in (*first, *values)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def xid_of_record(rec: XidRecord) -> Xid:
    """The ``xid`` kind of a parsed record: the record, its catalog entry and its decoded details."""
    return Xid.build(
        xid=rec.xid,
        pci_bus_id=rec.pci_bus_id,
        uuid=rec.uuid,
        pid=rec.pid,
        process=rec.process,
        message=rec.message,
        raw=rec.raw,
        details=rec.details,
        gpu_instance=rec.gpu_instance,
        compute_instance=rec.compute_instance,
    )


def record_to_json(rec: XidRecord) -> dict[str, Any]:
    """A JSON-ready dict: the record, its catalog entry (meaning, bucket, action) and its details flattened
    (the attributes of its ``xid`` event). A detail never replaces one of the fixed keys."""
    return dict(xid_of_record(rec).to_attrs())


def _lines(stream: BinaryIO) -> Iterator[str]:
    for raw in stream:
        yield raw.decode("utf-8", errors="replace")


def _stdin_lines(stdin: TextIO) -> Iterator[str]:
    buffer: BinaryIO | None = getattr(stdin, "buffer", None)
    if buffer is not None:
        yield from _lines(buffer)
    else:  # a text-only stream (tests, embedding): already decoded
        yield from stdin


def _read_path(path: str) -> Iterator[str]:
    try:
        with open(path, "rb") as fh:
            yield from _lines(fh)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _records(sources: Iterable[Iterator[str]]) -> Iterator[XidRecord]:
    for lines in sources:
        parser = XidParser()  # one log stream per input
        for line in lines:
            yield from parser.feed(line)


def run_xid(paths: Sequence[str], as_json: bool, stdin: TextIO, stdout: TextIO) -> int:
    """``watchd xid [--json] [FILE...]``: decode the Xid errors in each FILE (stdin when none, or for ``-``).

    Input is read as bytes and decoded as UTF-8 with replacement, so binary junk in a log never stops it.
    ``--json`` writes one JSON object per record and line (nothing when there is none); otherwise an aligned
    table, or ``no Xid found``. Returns 0; a file that cannot be read raises :class:`UsageError`.
    """
    names = list(paths) or ["-"]
    sources = (_stdin_lines(stdin) if name == "-" else _read_path(name) for name in names)
    if as_json:
        for rec in _records(sources):
            stdout.write(json.dumps(record_to_json(rec)) + "\n")
        return 0
    records = list(_records(sources))
    stdout.write((render_table(records) if records else NO_XID_FOUND) + "\n")
    return 0
