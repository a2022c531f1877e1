"""Loading a rule test file: its rule files checked, its tests with their events, or every problem found."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from watchd.model.events import Event
from watchd.rules.loader import Problem, check_rules
from watchd.rules.positions import YamlPath, YamlPositions, load_with_position
from watchd.rules.rule import Rule
from watchd.rules.unit_tests.events import parse_event
from watchd.rules.unit_tests.schema import CaseSpec, SpecError, SuiteSpec
from watchd.yamlfile import keys_at, suggestion


@dataclass(frozen=True)
class Case:
    spec: CaseSpec
    line: int
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Suite:
    source: str
    rules: tuple[Rule, ...]
    tests: tuple[Case, ...]


def load_test_file(path: Path) -> tuple[Suite | None, list[Problem]]:
    """The test file ready to run, or every problem found in it (and in the rule files it names)."""
    source = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        msg = "test file not found" if isinstance(exc, FileNotFoundError) else f"cannot read: {exc.strerror}"
        return None, [Problem(source, 1, 1, msg)]
    pos = YamlPositions(text)

    def problem(where: YamlPath, message: str, key: bool = False) -> Problem:
        line, col = pos.of(where, key)
        return Problem(source, line, col, message)

    data, error = load_with_position(text)
    if error is not None:
        return None, [Problem(source, *error)]
    if not isinstance(data, dict):
        return None, [problem((), "a test file is a mapping with 'rule_files' and 'tests'")]
    try:
        spec = SuiteSpec.model_validate(data)
    except ValidationError as exc:
        invalid = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            unknown = err["type"] == "extra_forbidden"
            msg = "unknown key" if unknown else err["msg"].removeprefix("Value error, ")
            if unknown:
                msg += suggestion(str(loc[-1]), keys_at(SuiteSpec, loc[:-1]))
            invalid.append(problem(loc, f"{_where(data, loc)}: {msg}", key=unknown))
        return None, sorted(invalid, key=lambda p: (p.line, p.column))

    problems: list[Problem] = []
    rule_paths: list[Path] = []
    for i, name in enumerate(spec.rule_files):
        rule_path = path.parent / name
        if not rule_path.exists():
            problems.append(problem(("rule_files", i), f"rule_files[{i}]: rule file not found: {rule_path}"))
        rule_paths.append(rule_path)
    if problems:
        return None, problems
    rules, rule_problems = check_rules(rule_paths)
    if rule_problems:
        return None, rule_problems
    names = {r.name for r in rules}

    tests: list[Case] = []
    seen: dict[str, int] = {}
    for t, test in enumerate(spec.tests):
        at: YamlPath = ("tests", t)
        label = f"test {test.name!r}"
        line, _ = pos.of(at)
        if test.name in seen:
            problems.append(
                problem((*at, "name"), f"{label}: duplicate test name (first at line {seen[test.name]})")
            )
        seen.setdefault(test.name, line)
        for key in ("expect", "expect_none"):
            for j, exp in enumerate(getattr(test, key)):
                if exp.rule is not None and exp.rule not in names:
                    problems.append(
                        problem((*at, key, j, "rule"), f"{label}: {key}[{j}]: no rule named {exp.rule!r}")
                    )
        events: list[Event] = []
        for j, item in enumerate(test.events):
            try:
                tmpl = parse_event(item, (*at, "events", j))
            except SpecError as exc:
                problems.append(problem(exc.path, f"{label}: events[{j}]: {exc}", key=exc.key))
                continue
            base = {**spec.defaults.get(tmpl.kind, {}), **test.defaults.get(tmpl.kind, {}), **tmpl.attrs}
            for k, when in enumerate(tmpl.times):
                eid = tmpl.id if tmpl.id is not None and len(tmpl.times) == 1 else None
                if eid is None:
                    eid = f"{tmpl.id or f't{t}e{j}'}" + (f".{k}" if len(tmpl.times) > 1 else "")
                events.append(Event(eid, tmpl.node, tmpl.source, tmpl.kind, when, dict(base)))
        events.sort(key=lambda e: e.time)  # stable: same-time events keep their order
        tests.append(Case(test, line, tuple(events)))
    if problems:
        return None, problems
    return Suite(source, tuple(rules), tuple(tests)), []


def _where(data: Any, loc: tuple[Any, ...]) -> str:
    """``tests[1] 'name': expect.0.at`` for a pydantic location."""
    if len(loc) >= 2 and loc[0] == "tests" and isinstance(loc[1], int):
        try:
            name = data["tests"][loc[1]].get("name")
        except (KeyError, IndexError, TypeError, AttributeError):
            name = None
        label = f"test {name!r}" if isinstance(name, str) else f"tests[{loc[1]}]"
        rest = ".".join(str(p) for p in loc[2:])
        return f"{label}: {rest}" if rest else label
    return ".".join(str(p) for p in loc) or "(file)"
