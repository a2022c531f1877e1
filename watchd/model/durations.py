"""Durations in rule files: ``30s``, ``5m``, ``24h``, ``28d``, ``1h30m``, or a number of seconds; and the
plain positive number of seconds of the daemons' config sections (:data:`Seconds`)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m, 24h")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        pos, seconds = 0, 0.0
        for m in _PART.finditer(text):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _UNIT[m.group(2)]
            pos = m.end()
        if pos != len(text) or not text:
            raise ValueError(f"bad duration {value!r}: use e.g. 30s, 5m, 24h, 1h30m")
    else:
        raise ValueError("expected a duration such as 30s, 5m, 24h")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


#: What a duration looks like to an editor (watchd rules schema): the units parse_duration reads.
DURATION_JSON_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|s|m|h|d|w))+$"},
    ],
    "description": "seconds, or e.g. 30s, 5m, 24h, 28d, 1h30m",
}

Duration = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(DURATION_JSON_SCHEMA)]

#: A config section's duration: a positive number of seconds (no units).
Seconds = Annotated[float, Field(gt=0)]
