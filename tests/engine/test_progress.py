"""The progress line of a long command: on a terminal only, rewritten in place, erased at the end."""

from __future__ import annotations

import io
import os
import pty
import time

from watchd.progress import is_terminal, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_the_line_rewritten_then_erased() -> None:
    err = Terminal()
    with progress("validating gpu-1", err, delay_s=0.05, every_s=0.05):
        time.sleep(0.3)
    text = err.getvalue()
    assert text.startswith("\rvalidating gpu-1: 0 s (Ctrl-C stops waiting)\x1b[K")
    assert text.count("\rvalidating gpu-1: ") >= 2  # rewritten in place, never a new line
    assert "\n" not in text and text.endswith("\r\x1b[K")  # erased: the answer prints on a clean line


def test_a_quick_answer_draws_nothing_and_a_pipe_never_sees_it() -> None:
    err = Terminal()
    with progress("checks run", err, delay_s=1.0):
        pass
    assert err.getvalue() == ""
    piped = io.StringIO()
    with progress("checks run", piped, delay_s=0.0, every_s=0.01):
        time.sleep(0.05)
    assert piped.getvalue() == ""


def test_a_real_terminal_is_one() -> None:
    leader, follower = pty.openpty()
    try:
        with os.fdopen(os.dup(follower), "w") as stream:
            assert is_terminal(stream)
        read, write = os.pipe()
        with os.fdopen(write, "w") as stream:
            assert not is_terminal(stream)
        os.close(read)
    finally:
        os.close(leader)
        os.close(follower)
