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

from watchd.events import Event

OPERATORS = frozenset({"in", "not_in", "regex", "gt", "ge", "lt", "le", "exists"})

Path = tuple[str | int, ...]


class MatchError(ValueError):
    """A problem in a match expression, at ``path`` inside it."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = path


Predicate = Callable[[Event], bool]
Getter = Callable[[Event], Any]

_TOP_LEVEL = frozenset({"id", "node", "source", "kind", "time"})


def getter(name: str) -> Getter:
    """A field reader compiled once: an attribute for the top-level fields, a dict lookup otherwise."""
    if name in _TOP_LEVEL:
        return operator.attrgetter(name)
    return lambda e: e.attrs.get(name)


def tuple_getter(names: Sequence[str]) -> Callable[[Event], tuple[Any, ...]]:
    """The values of ``names`` as a tuple (a group key): one generated expression, no call per field.

    The source holds only ``e.<field>`` for the fixed top-level fields and ``a.get(kN)`` with the
    attribute names bound as values, never text from a rule."""
    namespace: dict[str, Any] = {}
    parts = []
    for i, name in enumerate(names):
        if name in _TOP_LEVEL:
            parts.append(f"e.{name}")
        else:
            namespace[f"k{i}"] = name
            parts.append(f"a.get(k{i})")
    body = f"({', '.join(parts)},)" if parts else "()"
    source = f"def key(e):\n    a = e.attrs\n    return {body}\n"
    exec(compile(source, "<group key>", "exec"), namespace)  # generated from the fixed parts above
    return namespace["key"]  # type: ignore[no-any-return]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


#: Characters a regex may consist of to be tested as a plain substring (no metacharacter among them).
_LITERAL = re.compile(r"[A-Za-z0-9 _@:=/,;<>!~%&#-]+")


# The hot path: each operator reads its field inline (``e.attrs.get`` for attributes, a C attrgetter for
# top-level fields) rather than through another function call.
def _compile_operator(name: str, op: str, arg: Any, path: Path) -> Predicate:
    attr = None if name in _TOP_LEVEL else name
    get = getter(name)
    if op in ("in", "not_in"):
        if not isinstance(arg, list) or not all(isinstance(a, str | int | float | bool) for a in arg):
            raise MatchError(path, f"'{op}' takes a list of values")
        options = frozenset(arg)
        if op == "in":
            if attr is not None:
                return lambda e: e.attrs.get(attr) in options
            return lambda e: get(e) in options
        if attr is not None:
            return lambda e: e.attrs.get(attr) not in options
        return lambda e: get(e) not in options
    if op == "regex":
        if not isinstance(arg, str):
            raise MatchError(path, "'regex' takes a string")
        try:
            pattern = re.compile(arg)
        except re.error as exc:
            raise MatchError(path, f"bad regex {arg!r}: {exc}") from None
        return _regex(attr, get, arg, pattern)
    if op == "exists":
        if not isinstance(arg, bool):
            raise MatchError(path, "'exists' takes true or false")
        if attr is not None:
            return lambda e: (e.attrs.get(attr) is not None) == arg
        return lambda e: (get(e) is not None) == arg
    bound = _number(arg)
    if bound is None:
        raise MatchError(path, f"'{op}' takes a number")
    compare: Callable[[float, float], bool] = {
        "gt": float.__gt__,
        "ge": float.__ge__,
        "lt": float.__lt__,
        "le": float.__le__,
    }[op]

    def numeric(e: Event) -> bool:
        value = e.attrs.get(attr) if attr is not None else get(e)
        if value.__class__ is not float and value.__class__ is not int:  # bool and others: the slow check
            value = _number(value)
            if value is None:
                return False
        return compare(float(value), bound)

    return numeric


def _regex(attr: str | None, get: Getter, source: str, pattern: re.Pattern[str]) -> Predicate:
    """``regex``: a pattern without metacharacters is a substring test (the same answer, no regex call)."""
    literal = source if _LITERAL.fullmatch(source) else None

    def regex(e: Event) -> bool:
        value = e.attrs.get(attr) if attr is not None else get(e)
        if value is None:
            return False
        text = value if value.__class__ is str else str(value)
        if literal is not None:
            return literal in text
        return pattern.search(text) is not None

    return regex


def compile_match(match: Mapping[str, Any], path: Path = (), skip: frozenset[str] = frozenset()) -> Predicate:
    """Compile a match mapping once, at load, into one predicate. Raises MatchError with the path.

    ``skip``: keys not to check (the rule index already guarantees them); they are still validated."""
    checks: list[Predicate] = []
    for key, cond in match.items():
        here = (*path, key)
        if key in skip:
            compile_match({key: cond}, path)  # validate only
            continue
        if key == "any":
            if not isinstance(cond, list) or not cond or not all(isinstance(c, dict) for c in cond):
                raise MatchError(here, "'any' takes a non-empty list of matches")
            alternatives = [compile_match(c, (*here, i)) for i, c in enumerate(cond)]
            checks.append(any_of(alternatives))
        elif isinstance(cond, dict):
            unknown = set(cond) - OPERATORS
            if unknown or not cond:
                raise MatchError(here, f"unknown operator {sorted(unknown)}; use one of {sorted(OPERATORS)}")
            checks.extend(_compile_operator(key, op, arg, (*here, op)) for op, arg in cond.items())
        elif cond is None or isinstance(cond, str | int | float | bool):
            checks.append(_equals(key, cond))
        else:
            raise MatchError(here, "expected a value or an operator mapping")
    return all_of(checks)


def _equals(name: str, value: Any) -> Predicate:
    if name not in _TOP_LEVEL:
        return lambda e: bool(e.attrs.get(name) == value)
    get = getter(name)
    return lambda e: bool(get(e) == value)


def all_of(checks: list[Predicate]) -> Predicate:
    """One predicate from several, without a generator per call (this is the hot path)."""
    if not checks:
        return lambda e: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        a, b = checks
        return lambda e: a(e) and b(e)
    if len(checks) == 3:
        a, b, c = checks
        return lambda e: a(e) and b(e) and c(e)

    def every(e: Event) -> bool:
        for check in checks:  # noqa: SIM110 - no generator per call on the hot path
            if not check(e):
                return False
        return True

    return every


def any_of(checks: list[Predicate]) -> Predicate:
    """One predicate that holds when one of ``checks`` does, without a generator per call."""
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        a, b = checks
        return lambda e: a(e) or b(e)
    if len(checks) == 3:
        a, b, c = checks
        return lambda e: a(e) or b(e) or c(e)

    def some(e: Event) -> bool:
        for check in checks:  # noqa: SIM110 - no generator per call on the hot path
            if check(e):
                return True
        return False

    return some


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
