"""What a rule may say of how its actions run: its mode, and its rate limit (kept apart from the rule schema,
which derives from the action handler table: a decision carries them without importing that table)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from watchd.rules.durations import Duration
from watchd.strict import Strict

__all__ = ["Mode", "RateLimit"]

Mode = Literal["dry-run", "enforce"]


class RateLimit(Strict):
    """At most ``max`` disruptive actions by this rule within ``per``; beyond it they are held."""

    max: Annotated[int, Field(ge=1)]
    per: Duration
