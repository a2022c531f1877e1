"""Follow systemd units' journal: training jobs run as units (``systemd-run``, a launcher
service) write their output there.

Runs ``journalctl --follow --lines=0 --output=json --unit=<u> ...`` (from now on: what is already in the
journal was written before the agent looked) and yields each entry's ``MESSAGE`` with its
``__REALTIME_TIMESTAMP`` and ``__CURSOR`` (the line's key). An entry longer than ``max_line`` bytes is cut;
a line that is not JSON or has no message is counted in :attr:`JournaldUnitsSource.malformed`. ``command`` is
the journalctl to run (a test runs a real process of its own that prints journal JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence

from watchd.clock import Clock, SystemClock
from watchd.sources.base import LogLine, NothingToAcknowledge

__all__ = ["JournaldUnitsSource", "journal_entry"]

_MAX_LINE = 1 << 20


def journal_entry(raw: bytes) -> tuple[str, float | None, str | None] | None:
    """One ``journalctl -o json`` line: the message, its time (seconds) and cursor; None when unreadable."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    message = obj.get("MESSAGE")
    if isinstance(message, list):  # non-UTF-8 messages come as a byte array
        try:
            message = bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode(
                "utf-8", "replace"
            )
        except ValueError:
            return None
    if not isinstance(message, str):
        return None
    stamp = obj.get("__REALTIME_TIMESTAMP")
    when = int(stamp) / 1e6 if isinstance(stamp, str) and stamp.isdigit() else None
    cursor = obj.get("__CURSOR")
    return message, when, cursor if isinstance(cursor, str) else None


async def _skip_line(stream: asyncio.StreamReader, consumed: int) -> None:
    """Discard the rest of a line longer than the stream's limit, its newline included."""
    try:
        await stream.readexactly(consumed)
        while True:
            try:
                await stream.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as exc:
                await stream.readexactly(exc.consumed)
    except asyncio.IncompleteReadError:
        return  # the stream ended within the line: the caller sees the end at its next read


class JournaldUnitsSource(NothingToAcknowledge):
    def __init__(
        self,
        units: Sequence[str],
        *,
        command: Sequence[str] = ("journalctl",),
        clock: Clock | None = None,
        max_line: int = _MAX_LINE,
    ) -> None:
        self.name = "journald"
        self.units = tuple(units)
        self.command = tuple(command)
        self._clock = clock or SystemClock()
        self.max_line = max_line
        self.malformed = 0

    def argv(self) -> list[str]:
        return [
            *self.command,
            "--follow",
            "--lines=0",
            "--output=json",
            *(f"--unit={u}" for u in self.units),
        ]

    async def lines(self) -> AsyncIterator[LogLine]:
        proc = await asyncio.create_subprocess_exec(
            *self.argv(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=self.max_line,
        )
        assert proc.stdout is not None
        n = 0
        try:
            while True:
                try:
                    raw = await proc.stdout.readuntil(b"\n")
                except asyncio.LimitOverrunError as exc:
                    self.malformed += 1  # an overlong entry: dropped (to its end), counted
                    await _skip_line(proc.stdout, exc.consumed)
                    continue
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        self.malformed += 1
                    break
                entry = journal_entry(raw)
                if entry is None:
                    self.malformed += 1
                    continue
                message, when, cursor = entry
                n += 1
                for i, text in enumerate(message.splitlines() or [""]):
                    key = f"journal:{cursor or n}" + (f":{i}" if i else "")
                    yield LogLine(text, when if when is not None else self._clock.now(), key)
            code = await proc.wait()
            raise RuntimeError(f"journalctl exited with status {code}")
        finally:
            if proc.returncode is None:
                proc.kill()
                with contextlib.suppress(ProcessLookupError):
                    await proc.wait()
