"""A long-lived interactive ``scontrol`` co-process: one command line in, that command's stdout/stderr out.

Spawning ``scontrol`` costs ~3-4 ms per call; an interactive ``scontrol`` (commands on stdin) answers
``show node`` in ~1 ms and ``update`` in ~0.5 ms. This module owns one such child and frames its output.

Behaviour of the interactive mode this relies on (Slurm 22.05, Debian build with readline; checked against the
real test cluster, see tests/test_scontrol_session.py):

- With stdin a pipe, readline still prints the prompt ``scontrol: `` and *echoes each input line* to stdout,
  before the command's own output, all through the same stdio buffer (so in order). On a narrow "terminal"
  readline's redisplay may garble the echo of long lines (cursor-movement escapes, ``\\r<``): the child runs
  with ``TERM=dumb COLUMNS=1000000 INPUTRC=/dev/null``, and the echo is checked byte for byte anyway.
- ``show hostnames X`` prints ``X`` on stdout; an unknown keyword ``X`` prints ``invalid keyword: X`` on
  stderr (unbuffered) and scontrol carries on. Each command is followed by both as sentinels: stdout is
  read up to ``scontrol: show hostnames S\\nS\\nscontrol: S\\n`` (sentinel output, then the echo of the
  stderr sentinel), stderr up to ``invalid keyword: S\\n``. Commands run one after another in the child, so
  whatever precedes the sentinels belongs to the command. The prompt printed after the last sentinel starts
  the next command's stdout (``scontrol: <command>\\n``).
- There is no exit status per command: callers judge success by stderr (``update`` errors are
  ``slurm_update error: ...``; ``show node nope`` prints ``Node nope not found`` on *stdout*).
- Tokenizing (``_get_command`` in scontrol.c): words split on unquoted whitespace; ``"`` and ``'`` toggle
  quoting but stay in the word. ``Reason=`` alone then strips one leading and one trailing ``"`` from its
  value (the one-shot argv path does that too). A line equal to ``!!`` repeats the previous one; lines are
  otherwise not interpreted (no ``#`` comments, no history expansion). :func:`interactive_line` builds a line
  from an argv and refuses (returns None) what cannot round-trip exactly: non-printable or non-ASCII
  characters, quotes or whitespace outside a ``Reason=`` value, and ``Reason=`` values that would not stay
  one word.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import time
from collections.abc import Mapping, Sequence

from watchd.integrations.base import SchedulerError

# Environment for the child: no line wrapping or redisplay tricks in readline's echo, no user key bindings.
_CHILD_ENV = {"TERM": "dumb", "COLUMNS": "1000000", "LINES": "1000", "INPUTRC": "/dev/null"}
_PROMPT = "scontrol: "
_MAX_LINE = 64 * 1024  # longest command line sent to the child (the adapter's hostlists stay under 32 KiB)
_MAX_OUTPUT = 256 * 1024 * 1024  # a command printing more than this is treated as a framing failure
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")


class SessionError(SchedulerError):
    """The interactive scontrol failed (died, EOF, framing surprise): it has been killed; the next call
    starts a fresh one. The command may or may not have run."""


class SessionStartError(SessionError):
    """The interactive scontrol could not be started, or died before answering its first command."""


class SessionTimeout(SessionError):
    """A command did not complete in time (the child, if it was running it, has been killed)."""


def tokenize(line: str) -> list[str]:
    """Split a line the way interactive scontrol does (``_get_command``): unquoted whitespace separates words,
    quote characters toggle quoting and stay in the word."""
    words: list[str] = []
    i, n = 0, len(line)
    while i < n:
        if line[i].isspace():
            i += 1
            continue
        start = i
        dq = sq = False
        i += 1
        while i < n:
            c = line[i]
            if c == '"':
                dq = not dq
            elif c == "'":
                sq = not sq
            elif not (dq or sq) and c.isspace():
                break
            i += 1
        words.append(line[start:i])
    return words


def interactive_line(args: Sequence[str]) -> str | None:
    """The interactive command line for ``scontrol <args>``, or None when it cannot be sent safely.

    A ``Reason=`` value is sent double-quoted (scontrol strips exactly one quote from each end); every other
    word must be plain. The line is accepted only if scontrol's tokenizer gives back exactly these words."""
    words: list[str] = []
    for arg in args:
        key, eq, value = arg.partition("=")
        if eq and key.lower() == "reason":
            words.append(f'{key}="{value}"')
        else:
            if any(c.isspace() or c in "\"'" for c in arg) or not arg:
                return None
            words.append(arg)
    line = " ".join(words)
    if len(line) > _MAX_LINE or not _PRINTABLE_ASCII.fullmatch(line) or line.strip() == "!!":
        return None
    return line if tokenize(line) == words else None


class ScontrolSession:
    """One interactive ``scontrol`` child, started lazily and replaced after any failure.

    :meth:`run` sends one command line and returns that command's (stdout, stderr). Commands are serialized
    (one in flight); ``timeout`` covers the wait for the session too, so queued calls never take longer than
    their own timeout. Call :meth:`aclose` to stop the child."""

    def __init__(
        self,
        scontrol: str = "scontrol",
        *,
        env: Mapping[str, str] | None = None,
        max_age: float = 600.0,
    ) -> None:
        self.scontrol = scontrol
        self.env_extra = dict(env or {})
        self.max_age = max_age  # a child older than this is replaced (fresh config, bounded leaks)
        self._proc: asyncio.subprocess.Process | None = None
        self._started = 0.0
        self._out = bytearray()
        self._err = bytearray()
        self._token = secrets.token_hex(4)
        self._seq = 0
        self._lock = asyncio.Lock()
        self._last_seen = ""
        self.starts = 0  # children started so far (for tests and metrics)

    @property
    def pid(self) -> int | None:
        """The running child's pid, None when there is none."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    # ------------------------------------------------------------------ public
    async def run(self, command: str, timeout: float) -> tuple[str, str]:
        """Run one command line in the child; return its (stdout, stderr) without prompt, echo or sentinels.

        Raises ValueError for a line with a newline (or a carriage return); :class:`SessionStartError` when
        the child cannot be started; :class:`SessionTimeout`; :class:`SessionError` for anything else."""
        if "\n" in command or "\r" in command:
            raise ValueError(f"scontrol command must be one line: {command!r}")
        holding = False
        try:
            async with asyncio.timeout(timeout):
                async with self._lock:
                    holding = True
                    await self._ensure_started()
                    return await self._exchange(command)
        except TimeoutError:
            if not holding:
                raise SessionTimeout(
                    f"{self.scontrol} {command}: timed out after {timeout:g}s waiting for the interactive "
                    "scontrol (busy with earlier commands)"
                ) from None
            await self._kill()  # (done already when the exchange itself was interrupted)
            raise SessionTimeout(
                f"{self.scontrol} {command}: timed out after {timeout:g}s (interactive scontrol killed)"
                f"{self._last_seen}"
            ) from None

    async def aclose(self) -> None:
        """Stop the child: EOF on its stdin, then SIGKILL if it has not exited within a second. Does not
        wait for a command in flight (it fails with :class:`SessionError`). A later :meth:`run` starts a new
        child."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            await asyncio.wait_for(proc.wait(), 1.0)
        except (TimeoutError, OSError):
            await self._kill_proc(proc)
        except BaseException:
            await self._kill_proc(proc)
            raise

    async def __aenter__(self) -> ScontrolSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ internals
    async def _ensure_started(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if time.monotonic() - self._started < self.max_age:
                return
            await self._kill()  # idle (we hold the lock): nothing in flight
        self._proc = None
        self._out.clear()
        self._err.clear()
        env = {**os.environ, **self.env_extra, **_CHILD_ENV}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.scontrol,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except OSError as exc:  # FileNotFoundError, PermissionError
            raise SessionStartError(
                f"{self.scontrol} (interactive): cannot run {self.scontrol!r}: {exc}"
            ) from exc
        self._proc = proc
        self._started = time.monotonic()
        self.starts += 1
        try:
            out, _err = await self._exchange("oneliner")
        except SessionError as exc:
            raise SessionStartError(f"interactive scontrol did not start: {exc}") from exc
        if out:
            await self._kill()
            raise SessionStartError(f"interactive scontrol did not start: unexpected output {out!r}")
        # stderr at start-up (a warning about the config, say) is not an error: it is dropped.

    async def _exchange(self, command: str) -> tuple[str, str]:
        """Send one command and its two sentinels; read both streams up to them. Kills the child on
        failure."""
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        assert proc.stdout is not None and proc.stderr is not None
        self._seq += 1
        self._last_seen = ""
        mark = f"__watchd_{self._token}_{self._seq}__"
        out_end = f"{_PROMPT}show hostnames {mark}\n{mark}\n{_PROMPT}{mark}\n".encode()
        err_end = f"invalid keyword: {mark}\n".encode()
        try:
            proc.stdin.write(f"{command}\nshow hostnames {mark}\n{mark}\n".encode())
            await proc.stdin.drain()
            out_task = asyncio.ensure_future(_read_until(proc.stdout, self._out, out_end))
            err_task = asyncio.ensure_future(_read_until(proc.stderr, self._err, err_end))
            try:
                done, _ = await asyncio.wait({out_task, err_task}, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()  # raise the first failure
                out_b, err_b = out_task.result(), err_task.result()
            finally:
                for task in (out_task, err_task):
                    if not task.done():
                        task.cancel()
                        with contextlib.suppress(BaseException):
                            await task
                    elif not task.cancelled():
                        task.exception()  # both may have failed (EOF on each): the second is retrieved too
        except (OSError, EOFError, _FramingError) as exc:
            await self._kill()
            what = "exited" if isinstance(exc, OSError | EOFError) else str(exc)
            raise SessionError(
                f"{self.scontrol} {command}: interactive scontrol {what}{self._last_seen}"
            ) from None
        except BaseException:  # timeout, cancellation: the framing state is unknown
            await self._kill()
            raise
        echo = f"{_PROMPT}{command}\n".encode()
        if not out_b.startswith(echo):
            await self._kill()
            raise SessionError(
                f"{self.scontrol} {command}: interactive scontrol framing: no echo of the command; "
                f"stdout: {out_b[:2000]!r}"
            )
        return (
            out_b[len(echo) :].decode(errors="replace"),
            err_b.decode(errors="replace"),
        )

    def _seen(self, proc: asyncio.subprocess.Process | None) -> str:
        parts = []
        if self._out:
            parts.append(f"stdout: {bytes(self._out[-2000:])!r}")
        if self._err:
            parts.append(f"stderr: {bytes(self._err[-2000:])!r}")
        if proc is not None and proc.returncode is not None:
            parts.append(f"exit status {proc.returncode}")
        return ("; " + "; ".join(parts)) if parts else ""

    async def _kill(self) -> None:
        """Kill the child (if any); what it had printed is kept in ``_last_seen`` for error messages."""
        proc, self._proc = self._proc, None
        if proc is not None:
            await self._kill_proc(proc)
        if proc is not None or self._out or self._err:
            self._last_seen = self._seen(proc)
        self._out.clear()
        self._err.clear()

    @staticmethod
    async def _kill_proc(proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        # shielded: a cancelled caller must not leave a zombie behind
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())


class _FramingError(Exception):
    pass


async def _read_until(stream: asyncio.StreamReader, buf: bytearray, sep: bytes) -> bytes:
    """Read ``stream`` into ``buf`` until ``sep``; return what precedes it, keep what follows in ``buf``."""
    start = 0
    while True:
        i = buf.find(sep, start)
        if i >= 0:
            data = bytes(buf[:i])
            del buf[: i + len(sep)]
            return data
        if len(buf) > _MAX_OUTPUT:
            raise _FramingError(f"printed over {_MAX_OUTPUT} bytes without the end marker")
        start = max(0, len(buf) - len(sep) + 1)
        chunk = await stream.read(1 << 16)
        if not chunk:
            raise EOFError
        buf += chunk
