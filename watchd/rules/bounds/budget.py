"""What one template render may build and do (the bounds), the error of a render over them, and the
per-render budget: steps, text written, and a CPU-time deadline."""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any

#: The most a template may build: characters of a string (or items of a list, tuple, mapping), the text one
#: value converts to, the width or precision of a format spec, and the rendered text.
MAX_TEMPLATE_OUTPUT = 10_000
#: The most steps one render may take: a loop iteration, a call, a filter, an operator, a piece of output.
MAX_TEMPLATE_STEPS = 10_000
#: The most text one render may write, counting what macros and ``{% set %}`` blocks capture.
MAX_TEMPLATE_WRITTEN = 100_000
#: The largest integer ``*`` or ``**`` may build (bits: about 3,000 decimal digits), the largest exponent.
MAX_TEMPLATE_INT_BITS = 10_000
MAX_TEMPLATE_POWER = 100
#: CPU time one render may take (seconds): what stops a render whose every step is allowed but slow.
MAX_TEMPLATE_CPU_S = 0.005


class TemplateBoundError(Exception):
    """A template went over one of the bounds (at render, or found at load)."""


class _Budget:
    __slots__ = ("deadline", "steps", "tick", "written")

    def __init__(self) -> None:
        self.steps = 0
        self.written = 0
        self.tick = 0  # toward the next look at the clock
        self.deadline = 0.0  # set at the first look: a render too short to look never reads the clock


BUDGET: ContextVar[_Budget | None] = ContextVar("watchd_template_budget", default=None)


def start_budget() -> Any:
    """A fresh budget for the render about to run; pass the token to :func:`end_budget`."""
    return BUDGET.set(_Budget())


def end_budget(token: Any) -> None:
    BUDGET.reset(token)


def step(heavy: bool = False) -> None:
    """One step of the current render (none outside a render: at load, nothing is charged). The CPU clock
    (a system call) is read every 32 light steps (a loop iteration, an output) or 2 heavy ones (a call, a
    filter); the deadline runs from the first reading."""
    b = BUDGET.get()
    if b is None:
        return
    b.steps += 1
    if b.steps > MAX_TEMPLATE_STEPS:
        raise TemplateBoundError(f"the template took more than {MAX_TEMPLATE_STEPS:,} steps")
    b.tick += 16 if heavy else 1
    if b.tick >= 32:
        b.tick = 0
        now = time.thread_time()
        if not b.deadline:
            b.deadline = now + MAX_TEMPLATE_CPU_S
        elif now > b.deadline:
            raise TemplateBoundError(
                f"the template ran past its {MAX_TEMPLATE_CPU_S * 1000:g} ms of CPU time"
            )
