"""The kernel's messages from the systemd journal: ``journalctl --output=json --follow _TRANSPORT=kernel``.

journald stamps every entry with trusted fields a client cannot set; ``_TRANSPORT=kernel`` marks what it read
from the kernel ring buffer. A ``logger -t kernel "NVRM: Xid ..."`` line arrives with ``_TRANSPORT=syslog``:
journalctl's match leaves it out, and a line that still comes through without ``_TRANSPORT=kernel`` is yielded
untrusted (never Xid evidence). Use this source where the agent cannot read ``/dev/kmsg`` but can read the
journal (``systemd-journal`` group), or where the ring buffer is too small to keep up.

The position is the journal cursor of the last line read, saved to ``cursor_file`` (resumed with
``--after-cursor``); without one, reading starts at the end of the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from watchd.logs import get_logger
from watchd.sources.base import LogLine, NothingToAcknowledge

_log = get_logger("watchd.source.journald")
_MAX_ENTRY = 1 << 20
_CURSOR_RE = re.compile(r"[\x20-\x7e]{1,512}")


def _message(value: Any) -> str | None:
    """MESSAGE as journalctl's JSON writes it: a string, or a list of byte values (not valid UTF-8)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value).decode("utf-8", "replace")
    return None


def line_of_entry(raw: bytes) -> LogLine | None:
    """Pure: one ``journalctl -o json`` line as LogLines' source line; None when it is not an entry."""
    try:
        entry = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(entry, dict):
        return None
    message = _message(entry.get("MESSAGE"))
    cursor = entry.get("__CURSOR")
    if message is None or not isinstance(cursor, str):
        return None
    try:
        when = int(entry.get("__REALTIME_TIMESTAMP", "0")) / 1e6
    except (TypeError, ValueError):
        when = 0.0
    return LogLine(message, when, f"journal:{cursor}", trusted=entry.get("_TRANSPORT") == "kernel")


class JournaldSource(NothingToAcknowledge):
    def __init__(
        self,
        journalctl: str = "journalctl",
        *,
        cursor_file: Path | None = None,
        directory: Path | None = None,
        files: list[Path] | None = None,
        from_start: bool = False,
    ) -> None:
        self.name = "journald"
        self.journalctl = journalctl
        self.cursor_file = cursor_file
        self.directory = directory
        self.files = files or []
        self.from_start = from_start
        self.cursor: str | None = None
        self.malformed = 0

    def command(self) -> list[str]:
        cmd = [self.journalctl, "--output=json", "--follow", "--no-pager", "--quiet"]
        if self.directory is not None:
            cmd.append(f"--directory={self.directory}")
        cmd += [f"--file={f}" for f in self.files]
        cursor = self.cursor or self._load_cursor()
        if cursor is not None:
            cmd.append(f"--after-cursor={cursor}")
        elif not self.from_start:
            cmd.append("--lines=0")
        else:
            cmd.append("--lines=all")
        cmd.append("_TRANSPORT=kernel")
        return cmd

    def _load_cursor(self) -> str | None:
        if self.cursor_file is None:
            return None
        try:
            text = self.cursor_file.read_text().strip()
        except OSError:
            return None
        return text if _CURSOR_RE.fullmatch(text) else None

    def save_cursor(self) -> None:
        if self.cursor_file is None or self.cursor is None:
            return
        tmp = self.cursor_file.with_suffix(".tmp")
        try:
            self.cursor_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(self.cursor + "\n")
            os.replace(tmp, self.cursor_file)
        except OSError as exc:
            _log.warning("journald_cursor_unwritable", path=str(self.cursor_file), error=exc.strerror)

    async def lines(self) -> AsyncIterator[LogLine]:
        proc = await asyncio.create_subprocess_exec(
            *self.command(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=_MAX_ENTRY,
        )
        assert proc.stdout is not None and proc.stderr is not None
        try:
            while True:
                try:
                    raw = await proc.stdout.readline()
                except ValueError:  # an entry past the limit: skip to its end
                    self.malformed += 1
                    continue
                if not raw:
                    err = (await proc.stderr.read(2000)).decode("utf-8", "replace").strip()
                    code = await proc.wait()
                    raise OSError(f"journalctl exited with {code}: {err or 'no output'}")
                line = line_of_entry(raw)
                if line is None:
                    self.malformed += 1
                    continue
                self.cursor = line.key.removeprefix("journal:")
                for i, text in enumerate(line.text.split("\n")):
                    key = line.key + (f":{i}" if i else "")
                    yield LogLine(text, line.time, key, trusted=line.trusted)
        finally:
            self.save_cursor()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), 2.0)
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
