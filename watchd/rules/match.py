"""Match expressions, compiled once at load into one predicate per rule.

A match is a mapping: every key must hold (AND); ``any: [match, ...]`` holds when one of its matches holds
(OR). A key names a field of the event (``kind``, ``node``, ``source`` or an attribute such as ``xid``) and
compares it with a scalar (equality) or an operator mapping: ``in``, ``not_in``, ``regex``, ``gt``, ``ge``,
``lt``, ``le``, ``exists``.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from watchd.model.events import TOP_LEVEL_FIELDS, Event
from watchd.rules.codegen import Namespace

OPERATORS = frozenset({"in", "not_in", "regex", "gt", "ge", "lt", "le", "exists"})

Path = tuple[str | int, ...]


class MatchError(ValueError):
    """A problem in a match expression, at ``path`` inside it."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = path


Predicate = Callable[[Event], bool]
Getter = Callable[[Event], Any]


def getter(name: str) -> Getter:
    """A field reader compiled once: an attribute for the top-level fields, a dict lookup otherwise."""
    if name in TOP_LEVEL_FIELDS:
        return operator.attrgetter(name)
    return lambda e: e.attrs.get(name)


def tuple_getter(names: Sequence[str]) -> Callable[[Event], tuple[Any, ...]]:
    """The values of ``names`` as a tuple (a group key): one generated expression, no call per field."""
    src = Source()
    return src.ns.define(f"def key(e):\n    a = e.attrs\n    return {src.key(names)}\n", "key", "<group key>")  # type: ignore[no-any-return]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


#: Characters a regex may consist of to be tested as a plain substring (no metacharacter among them).
_LITERAL = re.compile(r"[A-Za-z0-9 _@:=/,;<>!~%&#-]+")


class Source:
    """Generated code over ``e`` (the event) and ``a`` (its attrs); see watchd/rules/codegen.py."""

    def __init__(self, ns: Namespace | None = None) -> None:
        self.ns = ns if ns is not None else Namespace()
        self.bind = self.ns.bind

    def field(self, name: str) -> str:
        """A field's value (None when absent): ``e.<field>`` for the top-level ones, else ``a.get(...)``."""
        if name in TOP_LEVEL_FIELDS:
            return f"e.{name}"
        return f"a.get({self.bind(name)})"

    def key(self, names: Sequence[str]) -> str:
        """The values of ``names`` as a tuple (a group key)."""
        return f"({', '.join(self.field(name) for name in names)},)" if names else "()"

    def condition(
        self, match: Mapping[str, Any], predicate: Predicate, skip: frozenset[str] = frozenset()
    ) -> str:
        """A valid match (``predicate`` is its compiled form) as an expression, less the keys in ``skip``; a
        deeply nested one as a call of ``predicate`` (a function holding many must still compile)."""
        if match_depth(match) > _INLINE_DEPTH:
            return f"{self.bind(predicate)}(e)"
        return _expression(self, match, (), skip)


#: Matches nested deeper than this are called, not inlined (the compiler's recursion limit).
_INLINE_DEPTH = 20


def _operator(src: Source, name: str, op: str, arg: Any, path: Path) -> str:
    field = src.field(name)
    if op in ("in", "not_in"):
        if not isinstance(arg, list) or not all(isinstance(a, str | int | float | bool) for a in arg):
            raise MatchError(path, f"'{op}' takes a list of values")
        return f"({field} {'in' if op == 'in' else 'not in'} {src.bind(frozenset(arg))})"
    if op == "regex":
        if not isinstance(arg, str):
            raise MatchError(path, "'regex' takes a string")
        try:
            pattern = re.compile(arg)
        except re.error as exc:
            raise MatchError(path, f"bad regex {arg!r}: {exc}") from None
        return f"{src.bind(_regex_test(arg, pattern))}({field})"
    if op == "exists":
        if not isinstance(arg, bool):
            raise MatchError(path, "'exists' takes true or false")
        return f"({field} is {'not ' if arg else ''}None)"
    bound = _number(arg)
    if bound is None:
        raise MatchError(path, f"'{op}' takes a number")
    return f"{src.bind(_numeric_test(op, bound))}({field})"


def _numeric_test(op: str, bound: float) -> Callable[[Any], bool]:
    compare: Callable[[float, float], bool] = {
        "gt": float.__gt__,
        "ge": float.__ge__,
        "lt": float.__lt__,
        "le": float.__le__,
    }[op]

    def numeric(value: Any) -> bool:
        if value.__class__ is not float and value.__class__ is not int:  # bool and others: the slow check
            value = _number(value)
            if value is None:
                return False
        return compare(float(value), bound)

    return numeric


def _regex_test(source: str, pattern: re.Pattern[str]) -> Callable[[Any], bool]:
    """``regex``: a pattern without metacharacters is a substring test (the same answer, no regex call)."""
    literal = source if _LITERAL.fullmatch(source) else None

    def regex(value: Any) -> bool:
        if value is None:
            return False
        text = value if value.__class__ is str else str(value)
        if literal is not None:
            return literal in text
        return pattern.search(text) is not None

    return regex


def compile_match(match: Mapping[str, Any], path: Path = ()) -> Predicate:
    """Compile a match mapping once, at load, into one predicate: one generated function, the conditions
    inline (no call per condition on the hot path). Raises MatchError with the path."""
    src = Source()
    expression = _expression(src, match, path, frozenset())
    source = f"def match(e):\n    a = e.attrs\n    return {expression}\n"
    try:
        return src.ns.define(source, "match", "<match>")  # type: ignore[no-any-return]
    except (RecursionError, MemoryError, SyntaxError):
        raise MatchError(path, "match nested too deeply") from None


def _expression(src: Source, match: Mapping[str, Any], path: Path, skip: frozenset[str]) -> str:
    checks: list[str] = []
    for key, cond in match.items():
        here = (*path, key)
        if key in skip:
            _expression(Source(), {key: cond}, path, frozenset())  # validate only
            continue
        if key == "any":
            if not isinstance(cond, list) or not cond or not all(isinstance(c, dict) for c in cond):
                raise MatchError(here, "'any' takes a non-empty list of matches")
            alternatives = [_expression(src, c, (*here, i), frozenset()) for i, c in enumerate(cond)]
            checks.append(f"({' or '.join(alternatives)})")
        elif isinstance(cond, dict):
            unknown = set(cond) - OPERATORS
            if unknown or not cond:
                raise MatchError(here, f"unknown operator {sorted(unknown)}; use one of {sorted(OPERATORS)}")
            checks.extend(_operator(src, key, op, arg, (*here, op)) for op, arg in cond.items())
        elif cond is None or isinstance(cond, str | int | float | bool):
            checks.append(f"({src.field(key)} == {src.bind(cond)})")
        else:
            raise MatchError(here, "expected a value or an operator mapping")
    return f"({' and '.join(checks)})" if checks else "True"


def match_depth(value: Any) -> int:
    """How deeply a match's mappings and lists nest (a scalar: 0)."""
    if isinstance(value, Mapping):
        return 1 + max((match_depth(v) for v in value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max((match_depth(v) for v in value), default=0)
    return 0


def index_guarantees(match: Mapping[str, Any]) -> frozenset[str]:
    """The keys of a match that the rule index guarantees for the rules it finds (see ``index_plan``)."""
    kinds, pinned = index_plan(match)
    return frozenset(({"kind"} if kinds is not None else set()) | ({pinned[0]} if pinned else set()))


def index_plan(match: Mapping[str, Any]) -> tuple[frozenset[Any] | None, tuple[str, frozenset[Any]] | None]:
    """How the rule index finds a rule: by the kinds it pins (None: any kind) and, within them, by the one
    other pinned field with the fewest values (None: none). Both are then guaranteed for candidates."""
    keys = dict(index_keys(match))
    kinds = keys.pop("kind", None)
    field = min(keys.items(), key=lambda kv: (len(kv[1]), kv[0])) if keys else None
    return kinds, field


def index_keys(match: Mapping[str, Any]) -> list[tuple[str, frozenset[Any]]]:
    """Fields the match pins to a set of values (equality or ``in``): used to index rules by event."""
    keys = []
    for key, cond in match.items():
        if key == "any":
            continue
        if isinstance(cond, str | int | float | bool):
            keys.append((key, frozenset({cond})))
        elif isinstance(cond, dict) and set(cond) == {"in"} and isinstance(cond["in"], list):
            keys.append((key, frozenset(cond["in"])))
    return keys


def regex_gates(match: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The match's top-level ``field: {regex: ...}`` conditions whose pattern can be OR-ed with others into
    one search that fails exactly when each fails: no groups (so no backreferences) and no flags."""
    gates = []
    for key, cond in match.items():
        if key == "any" or not isinstance(cond, dict) or not isinstance(cond.get("regex"), str):
            continue
        try:
            pattern = re.compile(cond["regex"])
        except re.error:
            continue
        if pattern.groups == 0 and pattern.flags == re.UNICODE:
            gates.append((key, cond["regex"]))
    return gates


def match_kinds(match: Mapping[str, Any]) -> frozenset[str] | None:
    """The event kinds a match can hold for, when it says (``kind: xid`` or ``kind: {in: [...]}``)."""
    kind = match.get("kind")
    if isinstance(kind, str):
        return frozenset({kind})
    if isinstance(kind, dict) and isinstance(kind.get("in"), list):
        return frozenset(str(k) for k in kind["in"])
    return None
