"""The action pipeline's config sections: the cooldown and concurrency of actions (``actions:``) and the
blast-radius breaker (``safety:``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from watchd.model.durations import Seconds
from watchd.strict import Strict


class ActionsConfig(Strict):
    cooldown_s: Annotated[float, Field(ge=0)] = 600.0
    max_concurrent: Annotated[int, Field(ge=1)] = 1024


class SafetyConfig(Strict):
    max_fraction: Annotated[float, Field(gt=0, le=1)] = 0.10
    max_nodes: Annotated[int, Field(ge=1)] = 50
    window_s: Seconds = 3600.0
    pools_refresh_s: Seconds = 60.0
