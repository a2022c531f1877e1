"""The ``alertmanager:`` section of the engine config: where alerts go, how often they are sent again."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from watchd.model.durations import Seconds
from watchd.strict import Strict


class AlertmanagerConfig(Strict):
    urls: list[Annotated[str, Field(pattern=r"^https?://")]] = Field(default_factory=list)
    resend_interval_s: Seconds = 60.0
    timeout_s: Seconds = 5.0
