"""Finding the rules an event matches without trying every rule (the fast path's index).

Rules are indexed by the event ``kind`` they pin, then by one more field they pin (``xid: {in: [...]}``);
each candidate comes with the predicate left to check (what the index did not already guarantee). Within a
bucket, rules that test the same field with a regex are gated by one search of all their patterns OR-ed
together: when it fails, each of them would fail, and none is tried. The specification
(watchd/rules/specification.py) tries every rule with its whole match: the index must find exactly the rules
it finds (tests/rules/test_compiled_contract.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from watchd.model.events import Event
from watchd.rules.compiled.match import Source
from watchd.rules.rule import Rule

#: A rule in a bucket, and the keys of its match the index already guarantees there (not checked again).
Candidate = tuple[Rule, frozenset[str]]


#: What an index appends for a rule that matches: the rule itself, or what the engine runs for it.
Found = Callable[[Rule], Any]


class RuleIndex:
    """``found(rule)`` is appended for a matching rule (the rule itself by default). ``source`` gives the
    checks for an event of one kind as lines to inline into that kind's generated function; events of a kind
    no rule names share one, so a stream of made-up kinds costs no memory."""

    def __init__(self, rules: Iterable[Rule], found: Found | None = None) -> None:
        any_kind: list[Candidate] = []
        unkeyed: dict[str, list[Candidate]] = {}
        keyed: dict[str, dict[str, dict[Any, list[Candidate]]]] = {}
        for rule in rules:
            kinds, pinned = index_plan(rule.spec.match)
            if kinds is None:
                any_kind.append((rule, frozenset()))
                continue
            check = index_guarantees(rule.spec.match)
            for kind in kinds:
                if pinned is None:
                    unkeyed.setdefault(kind, []).append((rule, check))
                    continue
                name, values = pinned
                table = keyed.setdefault(kind, {}).setdefault(name, {})
                for value in values:
                    table.setdefault(value, []).append((rule, check))
        self.kinds = frozenset({*unkeyed, *keyed})
        self._fixed = {kind: Bucket(any_kind + unkeyed.get(kind, []), found=found) for kind in self.kinds}
        self._any = Bucket(any_kind, found=found)
        self._tables = {
            kind: tuple(
                (name, {value: Bucket(c, found=found).compiled() for value, c in table.items()})
                for name, table in keyed.get(kind, {}).items()
            )
            for kind in self.kinds
        }

    def source(self, kind: str | None, src: Source) -> list[str]:
        """Lines (indented one level) that call ``add`` with what was found for each rule an event of
        ``kind`` (None: a kind no rule names) matches; they read ``e`` and ``a`` (its attrs)."""
        lines = (self._fixed.get(kind, self._any) if kind is not None else self._any).source(src, "    ")
        for name, table in self._tables.get(kind, ()) if kind is not None else ():
            lines.append(f"    b = {src.bind(table)}.get({src.field(name)})")
            lines.append("    if b is not None: b(e, out)")
        return lines


Search = Callable[[str], "re.Match[str] | None"]
Collect = Callable[[Event, list[Any]], None]


class Bucket:
    """Candidates tried together: the plain ones one by one; those sharing a regex field behind one gate.
    ``source`` gives the checks as generated lines, ``compiled`` as one function ``(event, out)``."""

    __slots__ = ("found", "gated", "plain")

    def __init__(self, candidates: list[Candidate], found: Found | None = None) -> None:
        by_field: dict[str, list[tuple[str, Candidate]]] = {}
        plain: list[Candidate] = []
        for candidate in candidates:
            gates = regex_gates(candidate[0].spec.match)
            if gates:
                name, source = gates[0]
                by_field.setdefault(name, []).append((source, candidate))
            else:
                plain.append(candidate)
        gated: list[tuple[str, Search, tuple[Candidate, ...]]] = []
        for name, members in by_field.items():
            if len(members) == 1:  # a gate would only repeat the rule's own regex
                plain.append(members[0][1])
                continue
            pattern = re.compile("|".join(f"(?:{source})" for source, _ in members))
            gated.append((name, pattern.search, tuple(c for _, c in members)))
        self.plain = tuple(plain)
        self.gated = tuple(gated)
        self.found = found

    def compiled(self) -> Collect:
        src = Source()
        lines = ["def collect(e, out):", "    add = out.append", "    a = e.attrs", *self.source(src, "    ")]
        return src.ns.define("\n".join(lines) + "\n", "collect", "<rule bucket>")  # type: ignore[no-any-return]

    def source(self, src: Source, indent: str) -> list[str]:
        """The checks as lines over ``e``, ``a`` and ``add``: each rule's match inline (less what the index
        guarantees; a deeply nested one called instead), no loop, no call per candidate. They name only
        values bound in ``src``."""
        bound = src.bind

        def check(rule: Rule, skip: frozenset[str], indent: str) -> str:
            result = bound(rule if self.found is None else self.found(rule))
            condition = src.condition(rule.spec.match, rule.matches, skip)
            if condition == "True":
                return f"{indent}add({result})"
            return f"{indent}if {condition}: add({result})"

        lines = [check(rule, skip, indent) for rule, skip in self.plain]
        for name, search, members in self.gated:
            lines.append(f"{indent}x = {src.field(name)}")
            text = "x if x.__class__ is str else str(x)"
            lines.append(f"{indent}if x is not None and {bound(search)}({text}) is not None:")
            lines.extend(check(rule, skip, indent + "    ") for rule, skip in members)
        return lines


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
