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

from watchd.model.events import Event
from watchd.rules.match import (
    Source,
    index_guarantees,
    index_plan,
    regex_gates,
)
from watchd.rules.ruleset import Rule

#: A rule in a bucket, and the keys of its match the index already guarantees there (not checked again).
Candidate = tuple[Rule, frozenset[str]]


#: What an index appends for a rule that matches: the rule itself, or what the engine runs for it.
Found = Callable[[Rule], Any]


class Index(Protocol):
    def matching(self, event: Event, out: list[Any]) -> None:
        """Append what was found for each rule ``event`` matches to ``out``, in no particular order."""


class ScanIndex:
    """Every rule, tried with its whole match."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self._collect = Bucket([(r, frozenset()) for r in rules], gate=False).compiled()

    def matching(self, event: Event, out: list[Any]) -> None:
        self._collect(event, out)


class RuleIndex:
    """``found(rule)`` is appended for a matching rule (the rule itself by default). Each event kind the
    rules name gets one generated function (``source`` gives its body to inline elsewhere); events of any
    other kind share one, so a stream of made-up kinds costs no memory."""

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
        self._matching = {kind: self._compile(kind) for kind in self.kinds}
        self._other = self._compile(None)

    def matching(self, event: Event, out: list[Any]) -> None:
        self._matching.get(event.kind, self._other)(event, out)

    def source(self, kind: str | None, src: Source) -> list[str]:
        """Lines (indented one level) that call ``add`` with what was found for each rule an event of
        ``kind`` (None: a kind no rule names) matches; they read ``e`` and ``a`` (its attrs)."""
        lines = (self._fixed.get(kind, self._any) if kind is not None else self._any).source(src, "    ")
        for name, table in self._tables.get(kind, ()) if kind is not None else ():
            lines.append(f"    b = {src.bind(table)}.get({src.field(name)})")
            lines.append("    if b is not None: b(e, out)")
        return lines

    def _compile(self, kind: str | None) -> Collect:
        src = Source()
        lines = ["def matching(e, out):", "    add = out.append", "    a = e.attrs", *self.source(kind, src)]
        return src.ns.define("\n".join(lines) + "\n", "matching", "<rule index>")  # type: ignore[no-any-return]


Search = Callable[[str], "re.Match[str] | None"]
Collect = Callable[[Event, list[Any]], None]


class Bucket:
    """Candidates tried together: the plain ones one by one; those sharing a regex field behind one gate.
    ``source`` gives the checks as generated lines, ``compiled`` as one function ``(event, out)``."""

    __slots__ = ("found", "gated", "plain")

    def __init__(self, candidates: list[Candidate], gate: bool = True, found: Found | None = None) -> None:
        by_field: dict[str, list[tuple[str, Candidate]]] = {}
        plain: list[Candidate] = []
        for candidate in candidates:
            gates = regex_gates(candidate[0].spec.match) if gate else []
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
