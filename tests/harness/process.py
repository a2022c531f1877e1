"""What the harnesses share: is a process alive, and clean-up after harness runs that crashed."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def pid_alive(pid: int) -> bool:
    try:
        # a zombie still answers kill(0): look at its state
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def reap_stale_dirs(prefix: str, kill: Callable[[Path], None], base: Path | None = None) -> list[Path]:
    """For every harness dir ``<tmp>/<prefix>*`` whose owner (``owner.pid``) is dead: ``kill`` what it left
    running, then remove the dir. Returns the dirs reaped."""
    base = base or Path(tempfile.gettempdir())
    reaped = []
    for d in base.glob(f"{prefix}*"):
        try:
            owner = int((d / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if pid_alive(owner):
            continue
        kill(d)
        shutil.rmtree(d, ignore_errors=True)
        reaped.append(d)
    return reaped
