"""Finding the rules an event matches without trying every rule.

Rules are indexed by the event ``kind`` they pin, then by one more field they pin (``xid: {in: [...]}``);
each candidate comes with the predicate left to check (what the index did not already guarantee). Within a
bucket, rules that test the same field with a regex are gated by one search of all their patterns OR-ed
together: when it fails, each of them would fail, and none is tried. ``ScanIndex`` tries every rule with its
whole match: the reference the index must agree with (tests/test_rules.py); ~40x slower with 1,000 rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from watchd.events import Event
from watchd.rules.codegen import Namespace
from watchd.rules.match import Getter, Predicate, getter, index_plan, regex_gates
from watchd.rules.ruleset import Rule

Candidate = tuple[Rule, Predicate]


class Index(Protocol):
    def matching(self, event: Event, out: list[Rule]) -> None:
        """Append the rules ``event`` matches to ``out``, in no particular order."""


class ScanIndex:
    """Every rule, tried with its whole match."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self._bucket = Bucket([(r, r.matches) for r in rules], gate=False)

    def matching(self, event: Event, out: list[Rule]) -> None:
        self._bucket.collect(event, out)


class RuleIndex:
    def __init__(self, rules: Iterable[Rule]) -> None:
        any_kind: list[Candidate] = []
        unkeyed: dict[Any, list[Candidate]] = {}
        keyed: dict[Any, dict[str, dict[Any, list[Candidate]]]] = {}
        for rule in rules:
            kinds, pinned = index_plan(rule.spec.match)
            if kinds is None:
                any_kind.append((rule, rule.matches))
                continue
            check = rule.residual or rule.matches
            for kind in kinds:
                if pinned is None:
                    unkeyed.setdefault(kind, []).append((rule, check))
                    continue
                name, values = pinned
                table = keyed.setdefault(kind, {}).setdefault(name, {})
                for value in values:
                    table.setdefault(value, []).append((rule, check))
        self._other = _KindRules(Bucket(any_kind), ())
        self._kinds = {
            kind: _KindRules(
                Bucket(any_kind + unkeyed.get(kind, [])),
                tuple(
                    (getter(name), {value: Bucket(c) for value, c in table.items()})
                    for name, table in keyed.get(kind, {}).items()
                ),
            )
            for kind in {*unkeyed, *keyed}
        }

    def matching(self, event: Event, out: list[Rule]) -> None:
        rules = self._kinds.get(event.kind, self._other)
        rules.fixed.collect(event, out)
        for get, table in rules.tables:
            bucket = table.get(get(event))
            if bucket is not None:
                bucket.collect(event, out)


class _KindRules:
    __slots__ = ("fixed", "tables")

    def __init__(self, fixed: Bucket, tables: tuple[tuple[Getter, dict[Any, Bucket]], ...]) -> None:
        self.fixed = fixed  # tried for every event of the kind
        self.tables = tables  # (field, value -> bucket): tried when the event's field has the value


Search = Callable[[str], "re.Match[str] | None"]


class Bucket:
    """Candidates tried together: the plain ones one by one; those sharing a regex field behind one gate.
    ``collect(event, out)`` is one generated function with every check inline, in the order given."""

    __slots__ = ("collect", "gated", "plain")

    def __init__(self, candidates: list[Candidate], gate: bool = True) -> None:
        by_field: dict[str, list[tuple[str, Candidate]]] = {}
        plain: list[Candidate] = []
        for candidate in candidates:
            gates = regex_gates(candidate[0].spec.match) if gate else []
            if gates:
                name, source = gates[0]
                by_field.setdefault(name, []).append((source, candidate))
            else:
                plain.append(candidate)
        gated: list[tuple[Getter, Search, tuple[Candidate, ...]]] = []
        for name, members in by_field.items():
            if len(members) == 1:  # a gate would only repeat the rule's own regex
                plain.append(members[0][1])
                continue
            pattern = re.compile("|".join(f"(?:{source})" for source, _ in members))
            gated.append((getter(name), pattern.search, tuple(c for _, c in members)))
        self.plain = tuple(plain)
        self.gated = tuple(gated)
        self.collect: Callable[[Event, list[Rule]], None] = _collector(self.plain, self.gated)


def _collector(
    plain: tuple[Candidate, ...], gated: tuple[tuple[Getter, Search, tuple[Candidate, ...]], ...]
) -> Callable[[Event, list[Rule]], None]:
    """The bucket's checks as one function: no loop, no tuple unpacking per candidate. The source names only
    values bound in its namespace (rules, predicates, readers, searches)."""
    bound = (ns := Namespace()).bind
    lines = ["def collect(e, out):", "    add = out.append"]
    for rule, check in plain:
        lines.append(f"    if {bound(check)}(e): add({bound(rule)})")
    for get, search, members in gated:
        lines.append(f"    x = {bound(get)}(e)")
        lines.append(
            f"    if x is not None and {bound(search)}(x if x.__class__ is str else str(x)) is not None:"
        )
        lines.extend(f"        if {bound(check)}(e): add({bound(rule)})" for rule, check in members)
    return ns.define("\n".join(lines) + "\n", "collect", "<rule bucket>")  # type: ignore[no-any-return]
