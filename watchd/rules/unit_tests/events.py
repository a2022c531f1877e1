"""The events of a rule test: a line ``"<at> <node> <kind> key=value ..."`` or a mapping, and ``A..B/STEP``
time ranges."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from watchd.model.events import Scalar
from watchd.rules.durations import parse_duration
from watchd.rules.positions import YamlPath
from watchd.rules.unit_tests.schema import EPS, EventSpec, SpecError

_TIME_RANGE = re.compile(r"^(?P<start>[^.\s]+)\.\.(?P<end>[^/\s]+)/(?P<step>\S+)$")
_PAIR = re.compile(r"""\s*(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)=(?P<value>"(?:[^"\\]|\\.)*"|'[^']*'|[^\s"']*)""")
_INT = re.compile(r"^-?(?:0|[1-9][0-9]*)$")
_FLOAT = re.compile(r"^-?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$|^-?[0-9]+[eE][-+]?[0-9]+$")
RESERVED = frozenset({"node", "kind", "time"})


def _scalar(text: str) -> Scalar:
    if text.startswith('"'):
        value = json.loads(text)
        assert isinstance(value, str)
        return value
    if text.startswith("'"):
        return text[1:-1]
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return {"true": True, "false": False, "null": None}.get(text, text)


def _times(at: str | float) -> list[float]:
    """``10m`` -> [600]; ``0s..10m/5m`` -> [0, 300, 600]."""
    if isinstance(at, str) and (m := _TIME_RANGE.match(at.strip())):
        start, end, step = (parse_duration(m.group(g)) for g in ("start", "end", "step"))
        if step <= 0:
            raise ValueError(f"bad time range {at!r}: the step must be positive")
        if end < start:
            raise ValueError(f"bad time range {at!r}: it ends before it starts")
        n = math.floor((end - start) / step + EPS)
        if n >= 100_000:
            raise ValueError(f"time range {at!r} makes more than 100000 events")
        return [start + i * step for i in range(n + 1)]
    try:
        return [parse_duration(at)]
    except ValueError as exc:
        raise ValueError(f"{exc} (or A..B/STEP to repeat)") from None


@dataclass(frozen=True, slots=True)
class EventTemplate:
    times: tuple[float, ...]
    node: str
    kind: str
    source: str
    id: str | None
    attrs: dict[str, Scalar]


def parse_event_line(line: str) -> EventTemplate:
    """``"<at> <node> <kind> key=value ..."``; raises ValueError saying what is wrong."""
    parts = line.strip().split(None, 3)
    if len(parts) < 3:
        raise ValueError(f"event {line!r}: expected '<at> <node> <kind> key=value ...'")
    at, node, kind = parts[:3]
    rest = parts[3] if len(parts) == 4 else ""
    times = tuple(_times(at))
    attrs: dict[str, Scalar] = {}
    source, eid = "test", None
    pos = 0
    while pos < len(rest.rstrip()):
        m = _PAIR.match(rest, pos)
        if m is None or (m.end() < len(rest) and not rest[m.end()].isspace()):
            bad = rest[pos:].strip().split(None, 1)[0]
            raise ValueError(f"event {line!r}: expected key=value, got {bad!r} (quote values with spaces)")
        key, raw = m.group("key"), m.group("value")
        try:
            value = _scalar(raw)
        except json.JSONDecodeError:
            raise ValueError(f"event {line!r}: bad quoted value {raw}") from None
        if key in RESERVED:
            raise ValueError(f"event {line!r}: {key} is not an attribute (give <at> <node> <kind> first)")
        if key in attrs or (key == "source" and source != "test") or (key == "id" and eid is not None):
            raise ValueError(f"event {line!r}: {key} given twice")
        if key == "source":
            source = str(value)
        elif key == "id":
            eid = str(value)
        else:
            attrs[key] = value
        pos = m.end()
    return EventTemplate(times, node, kind, source, eid, attrs)


def parse_event(item: Any, path: YamlPath) -> EventTemplate:
    if isinstance(item, str):
        try:
            return parse_event_line(item)
        except ValueError as exc:
            raise SpecError(path, str(exc)) from None
    if not isinstance(item, dict):
        raise SpecError(path, "an event is a string '<at> <node> <kind> key=value ...' or a mapping")
    if len(item) == 1 and "at" not in item and " " in str(next(iter(item))):
        raise SpecError(
            path, "YAML read this event line as a mapping (it contains ': '): quote the whole line"
        )
    try:
        spec = EventSpec.model_validate(item)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(p for p in err["loc"] if p not in ("str", "float"))
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        where = ".".join(str(p) for p in loc)
        raise SpecError((*path, *loc), f"{where}: {msg}", key=err["type"] == "extra_forbidden") from None
    reserved = sorted(set(spec.attrs) & (RESERVED | {"source", "id"}))
    if reserved:
        raise SpecError((*path, "attrs"), f"attrs: {', '.join(reserved)} is not an attribute")
    try:
        times = _times(spec.at)
    except ValueError as exc:
        raise SpecError((*path, "at"), f"at: {exc}") from None
    return EventTemplate(tuple(times), spec.node, spec.kind, spec.source, spec.id, dict(spec.attrs))
