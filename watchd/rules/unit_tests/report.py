"""How a failed rule test is shown: one row per action (mark, time, rule, action, node, params), aligned."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from watchd.rules.unit_tests.schema import EPS

#: The main parameter of each action: shown for an unexpected action in a diff.
MAIN_PARAM = {"drain": "reason", "alert": "summary", "log": "message", "webhook": "url"}


def format_duration(seconds: float) -> str:
    """600 -> ``10m``, 5400 -> ``1h30m``, 0 -> ``0s``, 1.5 -> ``1.5s``."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    whole = int(seconds)
    frac = seconds - whole
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            out += f"{whole // size}{unit}"
            whole %= size
    if whole or frac > EPS or not out:
        secs = whole + frac
        out += f"{secs:g}s" if frac > EPS else f"{whole}s"
    return out


def _show(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


Row = tuple[str, str, str, str, str, str]  # mark, time, rule, action, node, params


def row(
    mark: str, at: float | None, rule: str | None, action: str, node: str | None, params: Mapping[str, Any]
) -> Row:
    shown = "  ".join(f"{k}={_show(v)}" for k, v in params.items())
    when = "*" if at is None else format_duration(at)
    return (mark, when, rule or "*", action, node or "*", shown)


def table(rows: Sequence[Row]) -> list[str]:
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(5)]
    lines = []
    for r in rows:
        cells = [r[0], r[1].rjust(widths[1]), *(r[i].ljust(widths[i]) for i in (2, 3, 4)), r[5]]
        lines.append(("  " + "  ".join(cells)).rstrip())
    return lines


def pick(params: Mapping[str, Any], keys: Mapping[str, Any]) -> dict[str, Any]:
    """The params named in ``keys`` (what an expectation asserted), None where absent."""
    return {k: params.get(k) for k in keys}
