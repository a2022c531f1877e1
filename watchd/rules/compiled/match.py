"""Match expressions as generated code: one predicate per match, compiled once at load, the conditions
inline (no call per condition on the hot path). What a match means is watchd/rules/specification.py's
``matches``; these functions must agree with it (tests/rules/test_compiled_contract.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from watchd.model.events import TOP_LEVEL_FIELDS, Event
from watchd.rules.compiled.codegen import Namespace
from watchd.rules.specification import MatchError, Path, check_match, number

Predicate = Callable[[Event], bool]


def tuple_getter(names: Sequence[str]) -> Callable[[Event], tuple[Any, ...]]:
    """The values of ``names`` as a tuple (a group key): one generated expression, no call per field."""
    src = Source()
    return src.ns.define(f"def key(e):\n    a = e.attrs\n    return {src.key(names)}\n", "key", "<group key>")  # type: ignore[no-any-return]


#: Characters a regex may consist of to be tested as a plain substring (no metacharacter among them).
_LITERAL = re.compile(r"[A-Za-z0-9 _@:=/,;<>!~%&#-]+")


class Source:
    """Generated code over ``e`` (the event) and ``a`` (its attrs); see watchd/rules/compiled/codegen.py."""

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
        return _expression(self, match, skip)


#: Matches nested deeper than this are called, not inlined (the compiler's recursion limit).
_INLINE_DEPTH = 20


def compile_match(match: Mapping[str, Any], path: Path = ()) -> Predicate:
    """Check a match (MatchError with the path) and compile it into one predicate: one generated function,
    the conditions inline."""
    check_match(match, path)
    src = Source()
    source = f"def match(e):\n    a = e.attrs\n    return {_expression(src, match, frozenset())}\n"
    try:
        return src.ns.define(source, "match", "<match>")  # type: ignore[no-any-return]
    except (RecursionError, MemoryError, SyntaxError):
        raise MatchError(path, "match nested too deeply") from None


def _expression(src: Source, match: Mapping[str, Any], skip: frozenset[str]) -> str:
    """A valid match as one expression, less the keys in ``skip``."""
    checks: list[str] = []
    for key, cond in match.items():
        if key in skip:
            continue
        if key == "any":
            alternatives = [_expression(src, c, frozenset()) for c in cond]
            checks.append(f"({' or '.join(alternatives)})")
        elif isinstance(cond, dict):
            checks.extend(_operator(src, key, op, arg) for op, arg in cond.items())
        else:
            checks.append(f"({src.field(key)} == {src.bind(cond)})")
    return f"({' and '.join(checks)})" if checks else "True"


def _operator(src: Source, name: str, op: str, arg: Any) -> str:
    field = src.field(name)
    if op in ("in", "not_in"):
        return f"({field} {'in' if op == 'in' else 'not in'} {src.bind(frozenset(arg))})"
    if op == "regex":
        return f"{src.bind(_regex_test(arg, re.compile(arg)))}({field})"
    if op == "exists":
        return f"({field} is {'not ' if arg else ''}None)"
    return f"{src.bind(_numeric_test(op, float(arg)))}({field})"


def _numeric_test(op: str, bound: float) -> Callable[[Any], bool]:
    compare: Callable[[float, float], bool] = {
        "gt": float.__gt__,
        "ge": float.__ge__,
        "lt": float.__lt__,
        "le": float.__le__,
    }[op]

    def numeric(value: Any) -> bool:
        if value.__class__ is not float and value.__class__ is not int:  # bool and others: the slow check
            value = number(value)
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


def match_depth(value: Any) -> int:
    """How deeply a match's mappings and lists nest (a scalar: 0)."""
    if isinstance(value, Mapping):
        return 1 + max((match_depth(v) for v in value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max((match_depth(v) for v in value), default=0)
    return 0
