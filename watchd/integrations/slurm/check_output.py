"""A Slurm check job's output, bound to the job that wrote it.

The job's script prints one line first, ``watchd-check run=RUN job=$SLURM_JOB_ID nonce=NONCE``: the nonce is
a secret of this run (in the script only, which Slurm shows to the job's owner and its administrators, and
in the state database), the job id is the one Slurm gave this job. An output is taken only when it begins
with exactly that line, is a regular file (not a link, FIFO, device or socket: never opened), is owned by
the engine's user (the jobs run as it) and is not writable by its group or by others. Anything else is no
output of this run: the reason is answered, never the content.

Reading is blocking (a hung file system, a huge file): :func:`read_output` runs on
:data:`watchd.untrusted.FILE_IO`, never on the event loop."""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Sequence

from watchd.untrusted import Refused, open_untrusted

__all__ = ["REFUSED", "UNREADABLE", "header", "read_output", "script"]

REFUSED = "check output refused"
UNREADABLE = "check output unreadable"
CUT = "\n# watchd: output cut at checks.max_output_bytes\n"


def header(run_id: str, job_id: str, nonce: str) -> str:
    """The first line the job prints (without its newline)."""
    return f"watchd-check run={run_id} job={job_id} nonce={nonce}"


def script(check: str, run_id: str, nonce: str, argv: Sequence[str]) -> str:
    """The batch script: the header (the job id is Slurm's, read by the job itself), then the check's
    program with stdout and stderr into the output file."""
    before, after = header(run_id, "\0", nonce).split("\0", 1)
    return (
        f"#!/bin/sh\n# watchd check {check}\n"
        f"printf '%s\\n' {shlex.quote(before)}\"$SLURM_JOB_ID\"{shlex.quote(after)}\n"
        f"exec {shlex.join(argv)} 2>&1\n"
    )


def _head(fd: int, n: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while total < n:
        chunk = os.read(fd, min(1 << 20, n - total))
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts)


def read_output(path: str, *, owner: int, expected: str, limit: int) -> tuple[str, str]:
    """(the output after the header, cut at ``limit`` bytes; "") or ("", why it was not taken: starting
    with :data:`REFUSED` or :data:`UNREADABLE`). Blocking."""
    try:
        fd = open_untrusted(path, owners=(owner,))
    except Refused as exc:
        what = UNREADABLE if exc.reason in ("missing", "unreadable") else REFUSED
        return "", f"{what}: {exc}"
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o022:
            who = "others" if mode & 0o002 else "its group"
            return "", f"{REFUSED}: {path}: writable by {who} (mode {mode:04o})"
        data = _head(fd, len(expected) + 1 + limit + 1)
    except OSError as exc:
        return "", f"{UNREADABLE}: {path}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    first, newline, rest = data.partition(b"\n")
    if not newline or first != expected.encode():
        job = expected.split(" job=", 1)[-1].split(" ", 1)[0]
        return (
            "",
            f"{REFUSED}: {path}: not this run's output (it does not begin with the line job {job} printed)",
        )
    text = rest[:limit].decode(errors="replace")
    return text + (CUT if len(rest) > limit else ""), ""
