"""Running rule tests: each test's timeline through a fresh engine, its actions compared with its
expectations; a failure reported as a table of actions (report.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from watchd.rules.durations import parse_duration
from watchd.rules.rule import Rule
from watchd.rules.rule_engine import RuleEngine
from watchd.rules.unit_tests.report import MAIN_PARAM, Row, pick, row, table
from watchd.rules.unit_tests.schema import EPS, ExpectSpec
from watchd.rules.unit_tests.suite import Case


@dataclass(frozen=True, slots=True)
class ActualAction:
    at: float
    rule: str
    severity: str
    action: str
    node: str
    params: Mapping[str, Any]


@dataclass
class CaseOutcome:
    file: str
    name: str
    line: int
    passed: bool
    report: list[str] = field(default_factory=list)


def _matches(exp: ExpectSpec, got: ActualAction) -> bool:
    if exp.action != got.action:
        return False
    if exp.at is not None and abs(exp.at - got.at) > EPS:
        return False
    if exp.node is not None and exp.node != got.node:
        return False
    if exp.rule is not None and exp.rule != got.rule:
        return False
    if exp.severity is not None and exp.severity != got.severity:
        return False
    return all(k in got.params and _equal(v, got.params[k]) for k, v in exp.params.items())


def _equal(want: Any, got: Any) -> bool:
    if isinstance(want, int | float) and isinstance(got, int | float) and not isinstance(want, bool):
        return abs(float(want) - float(got)) <= EPS
    if isinstance(want, str) and isinstance(got, int | float) and not isinstance(got, bool):
        try:
            return abs(parse_duration(want) - float(got)) <= EPS  # resolve_after: 1h
        except ValueError:
            return False
    return bool(want == got)


def run_case(case: Case, rules: tuple[Rule, ...], source: str) -> CaseOutcome:
    """Run one test's timeline through a fresh engine and compare the actions with its expectations."""
    engine = RuleEngine(rules)
    got: list[ActualAction] = []
    for event in case.events:
        for decision in engine.evaluate(event):
            got.extend(
                ActualAction(event.time, decision.rule, decision.severity, a.kind, a.node, a.params)
                for a in decision.actions
            )
    spec = case.spec
    used = [False] * len(got)
    pairing: list[int | None] = []
    for exp in spec.expect:
        found = None
        for i, action in enumerate(got):
            if not used[i] and _matches(exp, action):
                found = i
                used[i] = True
                break
        pairing.append(found)
    missing = [n for n, p in enumerate(pairing) if p is None]
    unexpected = [i for i, u in enumerate(used) if not u] if spec.exhaustive else []
    forbidden = [(exp, a) for exp in spec.expect_none for a in got if _matches(exp, a)]
    outcome = CaseOutcome(source, spec.name, case.line, not (missing or unexpected or forbidden))
    if outcome.passed:
        return outcome

    # One line per action in decision order: " " as expected, "-" expected but not decided, "+" decided but
    # not expected. A "-" goes right above the "+" that nearly matches it (same action and node), and both
    # show the params the expectation asserted; other "+" lines show the action's main param.
    near: dict[int, int] = {}  # unexpected actual index -> missing expectation index
    for n in missing:
        exp = spec.expect[n]
        for i in unexpected:
            a = got[i]
            if i not in near and a.action == exp.action and exp.node in (None, a.node):
                near[i] = n
                break
    keyed: list[tuple[float, float, Row]] = []
    for n, p in enumerate(pairing):
        exp = spec.expect[n]
        if p is not None:
            a = got[p]
            keyed.append(
                (a.at, 2 * p + 1, row(" ", a.at, a.rule, a.action, a.node, pick(a.params, exp.params)))
            )
    paired = {n: i for i, n in near.items()}
    for n in missing:
        exp = spec.expect[n]
        twin = paired.get(n)
        when, seq = (
            (got[twin].at, 2.0 * twin)
            if twin is not None
            else (exp.at if exp.at is not None else math.inf, math.inf)
        )
        keyed.append((when, seq, row("-", exp.at, exp.rule, exp.action, exp.node, exp.params)))
    for i in unexpected:
        a = got[i]
        if i in near:
            shown = pick(a.params, spec.expect[near[i]].params)
        else:
            main = MAIN_PARAM.get(a.action)
            shown = {main: a.params[main]} if main is not None and main in a.params else {}
        keyed.append((a.at, 2 * i + 1, row("+", a.at, a.rule, a.action, a.node, shown)))
    keyed.sort(key=lambda k: (k[0], k[1]))
    rows = [k[2] for k in keyed]
    bad = [row("!", a.at, a.rule, a.action, a.node, pick(a.params, exp.params)) for exp, a in forbidden]
    lines = table(rows + bad)
    report = [f"FAIL {source}:{case.line}: {spec.name}"]
    if rows:
        report.append("  (-: expected, not decided   +: decided, not expected)")
        report.extend(lines[: len(rows)])
    if bad:
        report.append("  (!: decided, but expect_none forbids it)")
        report.extend(lines[len(rows) :])
    outcome.report = report
    return outcome
