"""A progress line for a command that can take a while (``watchd node validate``, ``checks run``, ``report
usage``): on standard error, and only when it is a terminal, so pipes, files and scripts see nothing of it.
The line says what runs and for how long, is rewritten in place once a second, and is erased at the end."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

#: seconds before the line first shows: a quick answer draws nothing
DELAY_S = 1.0


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a file at all
        return False


@contextmanager
def progress(what: str, stream: TextIO, *, delay_s: float = DELAY_S, every_s: float = 1.0) -> Iterator[None]:
    """While the block runs: ``what: 12 s`` on ``stream`` when it is a terminal (nothing otherwise)."""
    if not is_terminal(stream):
        yield
        return
    done = threading.Event()
    started = time.monotonic()
    shown = [0]

    def tick() -> None:
        if done.wait(delay_s):
            return
        while not done.is_set():
            line = f"{what}: {time.monotonic() - started:.0f} s (Ctrl-C stops waiting)"
            try:
                stream.write("\r" + line + "\x1b[K")
                stream.flush()
            except (OSError, ValueError):
                return
            shown[0] = len(line)
            done.wait(every_s)

    thread = threading.Thread(target=tick, name="watchd-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if shown[0]:
            try:
                stream.write("\r\x1b[K")
                stream.flush()
            except (OSError, ValueError):
                pass
