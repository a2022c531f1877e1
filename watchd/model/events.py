"""The one event model shared by agent and engine, and its versioned wire format.

An :class:`Event` is one observation on one node: it names the node and the source that saw it, the time of
the observation (not of its arrival at the engine) and carries a stable ``id`` so that a re-sent or re-read
event is recognised as the same one. Kind-specific fields live in ``attrs``, plain scalars: each kind declares
them once, as a typed class (:mod:`watchd.model.registry` lists the kinds and their classes).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from watchd.xid.pci import normalize_pci

WIRE_VERSION = 1
INGEST_PATH = "/api/v1/events"

Scalar = str | int | float | bool | None


def stable_id(*parts: object) -> str:
    """A short, stable id for an observation, derived from what identifies it at its source."""
    digest = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=12)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    node: str
    source: str
    kind: str
    time: float
    attrs: dict[str, Scalar] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        """A field by name: top-level fields first, then ``attrs``; None when absent."""
        if name in TOP_LEVEL_FIELDS:
            return getattr(self, name)
        return self.attrs.get(name)

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "node": self.node,
            "source": self.source,
            "kind": self.kind,
            "time": self.time,
            "attrs": dict(self.attrs),
        }


#: The fields every event has; the rest live in ``attrs``.
TOP_LEVEL_FIELDS = frozenset({"id", "node", "source", "kind", "time"})


def batch_to_wire(node: str, events: list[Event]) -> dict[str, Any]:
    return {"version": WIRE_VERSION, "node": node, "events": [e.to_wire() for e in events]}


class WireError(ValueError):
    """A batch that does not follow the wire format; the message says what is wrong and where."""


_MAX_ID = 128
_MAX_STR = 8192
#: A node name: a host name (at most 253 characters) or a Kubernetes node name, printable, without blanks.
_MAX_NODE = 253
_MAX_KEY = 128
#: Integers in attrs fit SQLite's (and every consumer's) signed 64 bits.
_INT_MIN = -(2**63)
_INT_MAX = 2**63 - 1
#: Attributes with a shape the vocabulary knows: a value that is not one is refused.
_PCI_FIELDS = frozenset({"pci_bus_id"})


def _utf8(value: str) -> bool:
    """Whether ``value`` can be written as UTF-8 (a lone surrogate from a ``\\udc80`` escape cannot: it would
    fail later in the store, the log or an adapter, far from the request that brought it)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(obj: dict[str, Any], key: str, where: str, limit: int = 256) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise WireError(f"{where}.{key}: expected a non-empty string")
    if len(value) > limit:
        raise WireError(f"{where}.{key}: longer than {limit} characters")
    if not value.isascii() and not _utf8(value):
        raise WireError(f"{where}.{key}: not valid Unicode (a lone surrogate)")
    return value


def _node_name(value: str) -> bool:
    return value.isprintable() and " " not in value


def _node(obj: dict[str, Any], where: str) -> str:
    value = _text(obj, "node", where, _MAX_NODE)
    if not _node_name(value):
        raise WireError(f"{where}.node: expected a printable name without blanks")
    return value


def _pci_address(value: object) -> bool:
    """(normalize_pci caches what it parsed: a fleet has a few dozen addresses, met once per summary.)"""
    return type(value) is str and len(value) <= 64 and normalize_pci(value) is not None


def _check_attr(key: Any, value: Any, where: str) -> None:
    if len(key) > _MAX_KEY:
        raise WireError(f"{where}.attrs: a key longer than {_MAX_KEY} characters")
    if not _utf8(key):
        raise WireError(f"{where}.attrs: a key that is not valid Unicode (a lone surrogate)")
    if value is None:
        return
    if key in _PCI_FIELDS and not _pci_address(value):
        raise WireError(f"{where}.attrs.{key}: expected a PCI address (dddd:bb:dd.f)")
    if value is True or value is False:
        return
    kind = type(value)
    if kind is str:
        if len(value) > _MAX_STR:
            raise WireError(f"{where}.attrs.{key}: longer than {_MAX_STR} characters")
        if not _utf8(value):
            raise WireError(f"{where}.attrs.{key}: not valid Unicode (a lone surrogate)")
    elif kind is float:
        if not math.isfinite(value):
            raise WireError(f"{where}.attrs.{key}: expected a finite number (not NaN or Infinity)")
    elif kind is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise WireError(f"{where}.attrs.{key}: integer out of the 64-bit range")
    else:
        raise WireError(f"{where}.attrs.{key}: expected a string, number, boolean or null")


def fit_to_wire(event: Event) -> Event:
    """The event with any text attribute cut to what the wire accepts, marked ``truncated``: a huge log line
    still reaches the engine as an event instead of being refused there."""
    long = [k for k, v in event.attrs.items() if isinstance(v, str) and len(v) > _MAX_STR]
    if not long:
        return event
    attrs = dict(event.attrs)
    for key in long:
        text = attrs[key]
        assert isinstance(text, str)
        attrs[key] = text[: _MAX_STR - 32] + f"... [{len(text) - (_MAX_STR - 32)} chars cut]"
    attrs["truncated"] = True
    return Event(event.id, event.node, event.source, event.kind, event.time, attrs)


def event_from_wire(obj: Any, where: str) -> Event:
    if not isinstance(obj, dict):
        raise WireError(f"{where}: expected an object")
    unknown = set(obj) - _WIRE_KEYS
    if unknown:
        raise WireError(f"{where}: unknown keys {sorted(unknown)}")
    when = obj.get("time")
    if isinstance(when, bool) or not isinstance(when, int | float) or not 0 <= when < 1e11:
        raise WireError(f"{where}.time: expected seconds since the epoch")
    attrs = obj.get("attrs", {})
    if not isinstance(attrs, dict):
        raise WireError(f"{where}.attrs: expected an object")
    for key, value in attrs.items():  # the common case inline (the hot path); _check_attr says what is wrong
        t = type(value)
        if t is str:
            if len(value) > _MAX_STR or not value.isascii():
                _check_attr(key, value, where)
        elif t is float:
            if value - value != 0.0:  # NaN or +-Infinity
                _check_attr(key, value, where)
        elif t is int:
            if not _INT_MIN <= value <= _INT_MAX:
                _check_attr(key, value, where)
        elif value is not None and t is not bool:
            _check_attr(key, value, where)
        if len(key) > _MAX_KEY or not key.isascii():
            _check_attr(key, value, where)
    pci = attrs.get("pci_bus_id")
    if pci is not None and not _pci_address(pci):
        _check_attr("pci_bus_id", pci, where)
    return Event(
        id=_text(obj, "id", where, _MAX_ID),
        node=_node(obj, where),
        source=_text(obj, "source", where),
        kind=_text(obj, "kind", where, 64),
        time=float(when),
        attrs=attrs,
    )


_WIRE_KEYS = frozenset({"id", "node", "source", "kind", "time", "attrs"})


@dataclass(frozen=True, slots=True)
class WireBatch:
    """A decoded batch: the events that passed validation and, by index, why the others did not."""

    events: list[Event]
    invalid: list[tuple[int, str]]


def batch_from_wire(obj: Any, max_events: int) -> WireBatch:
    """Validate a decoded batch. A broken envelope raises WireError; a broken event is set aside on its own
    so that one bad record does not cost its neighbours (one agent bug must not lose a batch of Xids)."""
    if not isinstance(obj, dict):
        raise WireError("body: expected a JSON object")
    version = obj.get("version")
    if version != WIRE_VERSION:
        raise WireError(f"version: expected {WIRE_VERSION}, got {version!r}")
    events = obj.get("events")
    if not isinstance(events, list):
        raise WireError("events: expected a list")
    if len(events) > max_events:
        raise WireError(f"events: {len(events)} events in one batch, at most {max_events} allowed")
    valid: list[Event] = []
    invalid: list[tuple[int, str]] = []
    for i, e in enumerate(events):
        try:
            valid.append(event_from_wire(e, f"events[{i}]"))
        except WireError as exc:
            invalid.append((i, str(exc)))
    return WireBatch(valid, invalid)


# -------------------------------------------------------------------------------- the ingest fast path
#
# The engine's ingest decodes and checks a fleet's batches (at 100,000 GPUs about 20,000 events a second):
# the standard decoder and the checks above cost about 13-15 us an event, msgspec's typed decoder about 4. It
# accepts a strict subset of what batch_from_wire accepts, with the same events as the result; anything it
# refuses (a broken event, an old or new version, JSON it does not read: NaN, UTF-16, a lone surrogate) goes
# the slow way, which says what is wrong and sets a broken event aside on its own.

_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=_MAX_ID)]
_Node = Annotated[str, msgspec.Meta(min_length=1, max_length=_MAX_NODE)]
_Source = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
_Kind = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
_Time = Annotated[float, msgspec.Meta(ge=0, lt=1e11)]
_Key = Annotated[str, msgspec.Meta(max_length=_MAX_KEY)]
_WireScalar = (
    Annotated[str, msgspec.Meta(max_length=_MAX_STR)]
    | Annotated[int, msgspec.Meta(ge=_INT_MIN, le=_INT_MAX)]
    | float
    | bool
    | None
)


class _FastEvent(msgspec.Struct, forbid_unknown_fields=True):
    id: _Id
    node: _Node
    source: _Source
    kind: _Kind
    time: _Time
    attrs: dict[_Key, _WireScalar] = {}


class _FastBatch(msgspec.Struct):
    version: int
    events: list[_FastEvent]


_FAST_DECODER = msgspec.json.Decoder(_FastBatch)
_new_event = object.__new__
_SET = {name: Event.__dict__[name].__set__ for name in ("id", "node", "source", "kind", "time", "attrs")}


def valid_batch_from_json(raw: bytes, max_events: int) -> WireBatch | None:
    """The batch in the JSON body ``raw`` when all of it is valid, else None: then decode it and call
    :func:`batch_from_wire`, which says what is wrong."""
    try:
        batch = _FAST_DECODER.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    if batch.version != WIRE_VERSION or len(batch.events) > max_events:
        return None
    set_id, set_node, set_source = _SET["id"], _SET["node"], _SET["source"]
    set_kind, set_time, set_attrs = _SET["kind"], _SET["time"], _SET["attrs"]
    events: list[Event] = []
    for e in batch.events:
        if not _node_name(e.node):
            return None
        attrs = e.attrs
        pci = attrs.get("pci_bus_id")
        if pci is not None and not _pci_address(pci):
            return None
        # built through its slots: a frozen dataclass's __init__ is several times slower, and every value
        # has been checked
        event = _new_event(Event)
        set_id(event, e.id)
        set_node(event, e.node)
        set_source(event, e.source)
        set_kind(event, e.kind)
        set_time(event, e.time)
        set_attrs(event, attrs)
        events.append(event)
    return WireBatch(events, [])
