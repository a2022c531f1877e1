"""The base of the typed event kinds: a frozen dataclass per kind whose fields are the kind's ``attrs``.

A kind class (:mod:`watchd.model.xid`, :mod:`~watchd.model.gpu`, :mod:`~watchd.model.heartbeat`,
:mod:`~watchd.model.finding`, :mod:`~watchd.model.action`) declares its attributes once, in wire order;
:meth:`Attrs.to_attrs` builds the wire ``attrs`` from it and :meth:`Attrs.from_attrs` reads them back. The
hot paths (ingest, rule evaluation) keep working on :class:`~watchd.model.events.Event` and its plain
``attrs``: the classes are for building events and for reading them where a typed view pays off.

Conventions of the wire (version 1, unchanged):

* a field whose value is None is left out of ``attrs``, unless it is declared with :func:`keep_none` (then
  it is sent as ``null``: the Xid's ``uuid``, ``pid`` and ``process``);
* reading is strict on required fields (:class:`KindError`) and lenient on optional ones: a value of the
  wrong type (or a non-finite number) reads as None and is kept, untouched, in ``extra``; so is an
  attribute the class does not declare (a newer agent's), so nothing is lost on the way through;
* ``extra`` is written after the declared fields (or before the field named by ``EXTRA_BEFORE``);
* a list (a field typed ``tuple[str, ...]``: a finding's ``suspects``) is a tuple in the class; version 1 of
  the wire writes it comma-joined, as the rules and the agents and engines before it know it, and reading
  takes that form or a JSON array of strings alike (:func:`as_list`).
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints

from watchd.model.events import Event, Scalar

__all__ = ["Attrs", "KindError", "as_list", "keep_none", "wire_list"]

_KEEP = "watchd.keep_none"

A = TypeVar("A", bound="Attrs")


class KindError(ValueError):
    """Attributes that cannot be read as the kind: a required field is missing or of the wrong type."""


def keep_none(default: Any = None) -> Any:
    """A field sent as ``null`` when None (instead of being left out)."""
    return dataclasses.field(default=default, metadata={_KEEP: True})


Check = Callable[[object], bool]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_str(v: object) -> bool:
    return isinstance(v, str)


def _is_bool(v: object) -> bool:
    return isinstance(v, bool)


def _any(v: object) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def _is_list(v: object) -> bool:
    """A list as the wire carries it: the comma-joined form of version 1, or an array of strings."""
    return isinstance(v, str) or (isinstance(v, list | tuple) and all(isinstance(x, str) for x in v))


def as_list(v: object) -> tuple[str, ...]:
    """A list field's value read from the wire (after :func:`_is_list`): ``"a,b"`` and ``["a", "b"]`` alike;
    ``""`` is the empty list."""
    if isinstance(v, str):
        return tuple(v.split(",")) if v else ()
    assert isinstance(v, list | tuple)
    return tuple(v)


def wire_list(items: tuple[str, ...]) -> str:
    """A list field's value as version 1 of the wire writes it (comma-joined): :func:`as_list` reads it."""
    return ",".join(items)


_CHECKS: dict[object, Check] = {int: _is_int, float: _is_number, str: _is_str, bool: _is_bool}


def _check_of(hint: object) -> tuple[Check, bool]:
    """The value check of a field's type, and whether it admits None."""
    origin = get_origin(hint)
    if origin is Union or isinstance(hint, types.UnionType):
        members = [a for a in get_args(hint) if a is not type(None)]
        optional = len(members) < len(get_args(hint))
        if set(members) == {int, float}:
            return _is_number, optional
        if set(members) == {str, int, float, bool}:  # Scalar
            return _any, True
        if len(members) == 1:
            return _check_of(members[0])[0], optional
        raise TypeError(f"unsupported attribute type {hint!r}")
    if hint in _CHECKS:
        return _CHECKS[hint], False
    if get_origin(hint) is tuple and get_args(hint) == (str, ...):
        return _is_list, False
    raise TypeError(f"unsupported attribute type {hint!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    check: Check
    required: bool
    keep_none: bool


class Attrs:
    """Base of the kind classes (each a ``@dataclass(frozen=True, slots=True)`` with an ``extra`` field)."""

    __slots__ = ()
    #: The kind's name on the wire (the finding classes name several: :data:`KINDS`).
    KIND: ClassVar[str]
    #: The field before which ``extra`` is written (None: at the end).
    EXTRA_BEFORE: ClassVar[str | None] = None

    if TYPE_CHECKING:  # every kind class declares it as a dataclass field
        extra: Mapping[str, Scalar]

    @classmethod
    def specs(cls) -> tuple[_Spec, ...]:
        found = _SPECS.get(cls)
        if found is None:
            hints = get_type_hints(cls)
            specs = []
            for f in dataclasses.fields(cls):  # type: ignore[arg-type]
                if f.name == "extra":
                    continue
                check, _ = _check_of(hints[f.name])
                required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                specs.append(_Spec(f.name, check, required, bool(f.metadata.get(_KEEP))))
            found = _SPECS[cls] = tuple(specs)
        return found

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The attribute names this kind declares, in wire order."""
        return tuple(s.name for s in cls.specs())

    def to_attrs(self) -> dict[str, Scalar]:
        out: dict[str, Scalar] = {}
        extra = self.extra
        for spec in self.specs():
            if spec.name == self.EXTRA_BEFORE:
                out.update(extra)
            value = getattr(self, spec.name)
            if value is None and not spec.keep_none:
                continue
            out[spec.name] = wire_list(value) if spec.check is _is_list else value
        if self.EXTRA_BEFORE is None:
            out.update(extra)
        return out

    @classmethod
    def from_attrs(cls: type[A], attrs: Mapping[str, Scalar]) -> A:
        """The attributes as this kind; :class:`KindError` when a required field is missing or mistyped."""
        reader = _READERS.get(cls)
        if reader is None:
            reader = _READERS[cls] = _compile_reader(cls)
        return reader(cls, attrs)  # type: ignore[no-any-return]

    @classmethod
    def picker(cls, *names: str) -> Callable[[Mapping[str, Scalar]], tuple[Any, ...] | None]:
        """A reader of only ``names``, for a hot path that uses a few fields of a wide kind: their values in
        that order, each checked as :meth:`from_attrs` checks it (a mistyped optional one reads as None), or
        None where :meth:`read` would give None (a required one among them missing or mistyped)."""
        return _compile_picker(cls, names)

    @classmethod
    def read(cls: type[A], event: Event) -> A | None:
        """``event``'s attributes as this kind; None when they cannot be read as it."""
        try:
            return cls.from_attrs(event.attrs)
        except KindError:
            return None

    def to_event(self, *, id: str, node: str, source: str, time: float, kind: str | None = None) -> Event:
        return Event(
            id=id, node=node, source=source, kind=kind or self.KIND, time=time, attrs=self.to_attrs()
        )


_SPECS: dict[type, tuple[_Spec, ...]] = {}
_READERS: dict[type, Callable[[type, Mapping[str, Scalar]], Any]] = {}

# Inline checks for the generated readers: the exact JSON types first (what the wire decodes to), then the
# general check (subclasses); ``v - v == 0`` is false for inf and nan.
_INLINE: dict[Check, str] = {
    _is_int: "(type(v) is int or _is_int(v))",
    _is_number: "(type(v) is float and v - v == 0 or type(v) is int or _is_number(v))",
    _is_str: "(type(v) is str or _is_str(v))",
    _is_bool: "type(v) is bool",
    _any: "_any(v)",
    _is_list: "_is_list(v)",
}


def _slot_setter(cls: type, name: str) -> Callable[[object, object], None]:
    # a slots dataclass: the field's member descriptor, on the class that declares it (a kind's subclass
    # adds no fields: the finding kinds)
    descriptor = next(c.__dict__[name] for c in cls.__mro__ if name in c.__dict__)
    return descriptor.__set__  # type: ignore[no-any-return]


def _compile_reader(cls: type[Attrs]) -> Callable[[type, Mapping[str, Scalar]], Any]:
    """``from_attrs`` for one class, generated once: one ``get`` and one inline check per field (reading
    a summary is on the engine's ingest path)."""
    lines = ["def read(cls, attrs):", "    get = attrs.get", "    bad = None"]
    specs = cls.specs()
    for i, spec in enumerate(specs):
        var = f"f{i}"
        check = _INLINE[spec.check]
        lines.append(f"    {var} = v = get({spec.name!r})")
        if spec.required:
            where = f"{cls.__name__}: {spec.name}"
            lines += [
                f"    if v is None or not {check}:",
                f"        raise KindError({where!r} + (': missing' if v is None else f': not {{v!r}}'))",
            ]
        else:
            lines += [
                f"    if v is not None and not {check}:",
                f"        {var} = None",
                f"        bad = (bad or ()) + ({spec.name!r},)",
            ]
        if spec.check is _is_list:
            lines.append(f"    if {var} is not None:\n        {var} = as_list({var})")
    # The instance is filled through its slots, not __init__: a frozen dataclass's __init__ sets each field
    # with object.__setattr__, several times slower (and the reader has checked every value already).
    lines += [
        "    o = new(cls)",
        *[f"    S{i}(o, f{i})" for i in range(len(specs))],
        "    if bad is None and NAMES.issuperset(attrs):",
        "        SX(o, {})",
        "    else:",
        "        SX(o, {k: v for k, v in attrs.items() if k not in NAMES or (bad is not None and k in bad)})",
        "    return o",
    ]
    namespace: dict[str, Any] = {
        "KindError": KindError,
        "NAMES": frozenset(s.name for s in specs),
        "new": object.__new__,
        "SX": _slot_setter(cls, "extra"),
        "as_list": as_list,
        **{f"S{i}": _slot_setter(cls, spec.name) for i, spec in enumerate(specs)},
        **{f.__name__: f for f in _INLINE},
    }
    exec(compile("\n".join(lines), f"<{cls.__name__}.from_attrs>", "exec"), namespace)
    return namespace["read"]  # type: ignore[no-any-return]


def _compile_picker(cls: type[Attrs], names: tuple[str, ...]) -> Callable[[Mapping[str, Scalar]], Any]:
    specs = {s.name: s for s in cls.specs()}
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise TypeError(f"{cls.__name__} declares no {unknown}")
    required = [s for s in cls.specs() if s.required]
    lines = ["def pick(attrs):", "    get = attrs.get"]
    for spec in required:  # as read(): a required field missing or mistyped, even one not picked, is None
        lines += [
            f"    v = get({spec.name!r})",
            f"    if v is None or not {_INLINE[spec.check]}:",
            "        return None",
        ]
    out = []
    for i, name in enumerate(names):
        spec = specs[name]
        lines.append(f"    f{i} = v = get({name!r})")
        if not spec.required:
            lines.append(f"    if v is not None and not {_INLINE[spec.check]}:\n        f{i} = None")
        if spec.check is _is_list:
            lines.append(f"    if f{i} is not None:\n        f{i} = as_list(f{i})")
        out.append(f"f{i}")
    lines.append(f"    return ({', '.join(out)},)")
    namespace: dict[str, Any] = {"as_list": as_list, **{f.__name__: f for f in _INLINE}}
    exec(compile("\n".join(lines), f"<{cls.__name__}.picker>", "exec"), namespace)
    return namespace["pick"]  # type: ignore[no-any-return]
