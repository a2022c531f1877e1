"""Unit tests for rules (``watchd rules test``), in the spirit of ``promtool test rules``.

A test file names the rule files it tests and a list of tests; each test is a timeline of events and the
actions the rules must decide for it::

    rule_files: [../xid.yaml]              # relative to this file
    defaults:                              # attributes added to every event of a kind (optional)
      xid: {pci_bus_id: "0000:3b:00.0"}
    tests:
      - name: Xid 79 drains and requeues
        events:                            # "<at> <node> <kind> key=value ..."
          - 0s gpu-1 xid xid=79 bucket=RESTART_BM meaning="GPU has fallen off the bus"
          - {at: 10m, node: gpu-2, kind: xid, attrs: {xid: 13}}
        expect:                            # exactly the actions decided (unless exhaustive: false)
          - {at: 0s, node: gpu-1, action: drain, params: {reason: "Xid 79 ..."}}
          - {at: 0s, node: gpu-1, action: requeue}
        expect_none:                       # must not be decided at any time
          - {action: drain, node: gpu-2}

``at`` is a duration from the start of the timeline (``0s``, ``90s``, ``10m``, ``1h30m``, ``28d``);
``A..B/S`` repeats an event every S from A to B inclusive. Values are ints, floats, ``true``/``false``,
``null`` or strings; a quoted value (``"..."`` with JSON escapes, or ``'...'``) is always a string.
``source=`` and ``id=`` set the event's source and id instead of an attribute.

Evaluation is the engine's own (:class:`~watchd.rules.rule_engine.RuleEngine`), driven by the events' times
only.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from watchd.model.events import Event, Scalar
from watchd.rules.durations import Duration, parse_duration
from watchd.rules.loader import Problem, check_rules
from watchd.rules.model import ActionKind
from watchd.rules.positions import YamlPath, YamlPositions, load_with_position
from watchd.rules.rule import Rule
from watchd.rules.rule_engine import RuleEngine

__all__ = [
    "ActualAction",
    "CaseOutcome",
    "format_duration",
    "load_test_file",
    "parse_event_line",
    "run_test_files",
]

_EPS = 1e-6
#: The main parameter of each action: shown for an unexpected action in a diff.
_MAIN_PARAM = {"drain": "reason", "alert": "summary", "log": "message", "webhook": "url"}


# ------------------------------------------------------------------------------------------- the schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExpectSpec(_Strict):
    """One action the rules must decide. Unset fields match anything; ``params`` are compared one by one
    (only those given)."""

    at: Duration | None = Field(None, description="time from the start of the timeline")
    action: ActionKind
    node: str | None = None
    rule: str | None = None
    severity: Literal["info", "warning", "critical"] | None = None
    params: dict[str, Any] = Field(default_factory=dict)


class CaseSpec(_Strict):
    name: str = Field(min_length=1)
    events: list[Any] = Field(min_length=1)
    expect: list[ExpectSpec] = Field(default_factory=list)
    expect_none: list[ExpectSpec] = Field(default_factory=list)
    exhaustive: bool = Field(True, description="every decided action must be expected")
    defaults: dict[str, dict[str, Scalar]] = Field(default_factory=dict)


class SuiteSpec(_Strict):
    rule_files: list[str] = Field(min_length=1)
    defaults: dict[str, dict[str, Scalar]] = Field(
        default_factory=dict, description="kind -> attributes added to every event of that kind"
    )
    tests: list[CaseSpec] = Field(min_length=1)


class _EventSpec(_Strict):
    at: str | float
    node: str = Field(min_length=1)
    kind: str = Field(min_length=1)
    source: str = "test"
    id: str | None = None
    attrs: dict[str, Scalar] = Field(default_factory=dict)


class _SpecError(ValueError):
    def __init__(self, path: YamlPath, message: str, key: bool = False) -> None:
        super().__init__(message)
        self.path = path
        self.key = key


# ---------------------------------------------------------------------------------------------- events

_TIME_RANGE = re.compile(r"^(?P<start>[^.\s]+)\.\.(?P<end>[^/\s]+)/(?P<step>\S+)$")
_PAIR = re.compile(r"""\s*(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)=(?P<value>"(?:[^"\\]|\\.)*"|'[^']*'|[^\s"']*)""")
_INT = re.compile(r"^-?(?:0|[1-9][0-9]*)$")
_FLOAT = re.compile(r"^-?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$|^-?[0-9]+[eE][-+]?[0-9]+$")
_RESERVED = frozenset({"node", "kind", "time"})


def _scalar(text: str) -> Scalar:
    if text.startswith('"'):
        value = json.loads(text)
        assert isinstance(value, str)
        return value
    if text.startswith("'"):
        return text[1:-1]
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return {"true": True, "false": False, "null": None}.get(text, text)


def _times(at: str | float) -> list[float]:
    """``10m`` -> [600]; ``0s..10m/5m`` -> [0, 300, 600]."""
    if isinstance(at, str) and (m := _TIME_RANGE.match(at.strip())):
        start, end, step = (parse_duration(m.group(g)) for g in ("start", "end", "step"))
        if step <= 0:
            raise ValueError(f"bad time range {at!r}: the step must be positive")
        if end < start:
            raise ValueError(f"bad time range {at!r}: it ends before it starts")
        n = math.floor((end - start) / step + _EPS)
        if n >= 100_000:
            raise ValueError(f"time range {at!r} makes more than 100000 events")
        return [start + i * step for i in range(n + 1)]
    try:
        return [parse_duration(at)]
    except ValueError as exc:
        raise ValueError(f"{exc} (or A..B/STEP to repeat)") from None


@dataclass(frozen=True, slots=True)
class _EventTemplate:
    times: tuple[float, ...]
    node: str
    kind: str
    source: str
    id: str | None
    attrs: dict[str, Scalar]


def parse_event_line(line: str) -> _EventTemplate:
    """``"<at> <node> <kind> key=value ..."``; raises ValueError saying what is wrong."""
    parts = line.strip().split(None, 3)
    if len(parts) < 3:
        raise ValueError(f"event {line!r}: expected '<at> <node> <kind> key=value ...'")
    at, node, kind = parts[:3]
    rest = parts[3] if len(parts) == 4 else ""
    times = tuple(_times(at))
    attrs: dict[str, Scalar] = {}
    source, eid = "test", None
    pos = 0
    while pos < len(rest.rstrip()):
        m = _PAIR.match(rest, pos)
        if m is None or (m.end() < len(rest) and not rest[m.end()].isspace()):
            bad = rest[pos:].strip().split(None, 1)[0]
            raise ValueError(f"event {line!r}: expected key=value, got {bad!r} (quote values with spaces)")
        key, raw = m.group("key"), m.group("value")
        try:
            value = _scalar(raw)
        except json.JSONDecodeError:
            raise ValueError(f"event {line!r}: bad quoted value {raw}") from None
        if key in _RESERVED:
            raise ValueError(f"event {line!r}: {key} is not an attribute (give <at> <node> <kind> first)")
        if key in attrs or (key == "source" and source != "test") or (key == "id" and eid is not None):
            raise ValueError(f"event {line!r}: {key} given twice")
        if key == "source":
            source = str(value)
        elif key == "id":
            eid = str(value)
        else:
            attrs[key] = value
        pos = m.end()
    return _EventTemplate(times, node, kind, source, eid, attrs)


def _parse_event(item: Any, path: YamlPath) -> _EventTemplate:
    if isinstance(item, str):
        try:
            return parse_event_line(item)
        except ValueError as exc:
            raise _SpecError(path, str(exc)) from None
    if not isinstance(item, dict):
        raise _SpecError(path, "an event is a string '<at> <node> <kind> key=value ...' or a mapping")
    if len(item) == 1 and "at" not in item and " " in str(next(iter(item))):
        raise _SpecError(
            path, "YAML read this event line as a mapping (it contains ': '): quote the whole line"
        )
    try:
        spec = _EventSpec.model_validate(item)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(p for p in err["loc"] if p not in ("str", "float"))
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        where = ".".join(str(p) for p in loc)
        raise _SpecError((*path, *loc), f"{where}: {msg}", key=err["type"] == "extra_forbidden") from None
    reserved = sorted(set(spec.attrs) & (_RESERVED | {"source", "id"}))
    if reserved:
        raise _SpecError((*path, "attrs"), f"attrs: {', '.join(reserved)} is not an attribute")
    try:
        times = _times(spec.at)
    except ValueError as exc:
        raise _SpecError((*path, "at"), f"at: {exc}") from None
    return _EventTemplate(tuple(times), spec.node, spec.kind, spec.source, spec.id, dict(spec.attrs))


# ------------------------------------------------------------------------------------------ loading


@dataclass(frozen=True)
class _Case:
    spec: CaseSpec
    line: int
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Suite:
    source: str
    rules: tuple[Rule, ...]
    tests: tuple[_Case, ...]


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
            invalid.append(problem(loc, f"{_where(data, loc)}: {msg}", key=unknown))
        return None, invalid

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

    tests: list[_Case] = []
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
                tmpl = _parse_event(item, (*at, "events", j))
            except _SpecError as exc:
                problems.append(problem(exc.path, f"{label}: events[{j}]: {exc}", key=exc.key))
                continue
            base = {**spec.defaults.get(tmpl.kind, {}), **test.defaults.get(tmpl.kind, {}), **tmpl.attrs}
            for k, when in enumerate(tmpl.times):
                eid = tmpl.id if tmpl.id is not None and len(tmpl.times) == 1 else None
                if eid is None:
                    eid = f"{tmpl.id or f't{t}e{j}'}" + (f".{k}" if len(tmpl.times) > 1 else "")
                events.append(Event(eid, tmpl.node, tmpl.source, tmpl.kind, when, dict(base)))
        events.sort(key=lambda e: e.time)  # stable: same-time events keep their order
        tests.append(_Case(test, line, tuple(events)))
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


# ------------------------------------------------------------------------------------------- running


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
    if exp.at is not None and abs(exp.at - got.at) > _EPS:
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
        return abs(float(want) - float(got)) <= _EPS
    if isinstance(want, str) and isinstance(got, int | float) and not isinstance(got, bool):
        try:
            return abs(parse_duration(want) - float(got)) <= _EPS  # resolve_after: 1h
        except ValueError:
            return False
    return bool(want == got)


def format_duration(seconds: float) -> str:
    """600 -> ``10m``, 5400 -> ``1h30m``, 0 -> ``0s``, 1.5 -> ``1.5s``."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    whole = int(seconds)
    frac = seconds - whole
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            out += f"{whole // size}{unit}"
            whole %= size
    if whole or frac > _EPS or not out:
        secs = whole + frac
        out += f"{secs:g}s" if frac > _EPS else f"{whole}s"
    return out


def _show(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


Row = tuple[str, str, str, str, str, str]  # mark, time, rule, action, node, params


def _row(
    mark: str, at: float | None, rule: str | None, action: str, node: str | None, params: Mapping[str, Any]
) -> Row:
    shown = "  ".join(f"{k}={_show(v)}" for k, v in params.items())
    when = "*" if at is None else format_duration(at)
    return (mark, when, rule or "*", action, node or "*", shown)


def _table(rows: Sequence[Row]) -> list[str]:
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(5)]
    lines = []
    for r in rows:
        cells = [r[0], r[1].rjust(widths[1]), *(r[i].ljust(widths[i]) for i in (2, 3, 4)), r[5]]
        lines.append(("  " + "  ".join(cells)).rstrip())
    return lines


def run_case(case: _Case, rules: tuple[Rule, ...], source: str) -> CaseOutcome:
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
            keyed.append((a.at, 2 * p + 1, _row(" ", a.at, a.rule, a.action, a.node, _pick(a, exp.params))))
    paired = {n: i for i, n in near.items()}
    for n in missing:
        exp = spec.expect[n]
        twin = paired.get(n)
        when, seq = (
            (got[twin].at, 2.0 * twin)
            if twin is not None
            else (exp.at if exp.at is not None else math.inf, math.inf)
        )
        keyed.append((when, seq, _row("-", exp.at, exp.rule, exp.action, exp.node, exp.params)))
    for i in unexpected:
        a = got[i]
        if i in near:
            shown = _pick(a, spec.expect[near[i]].params)
        else:
            main = _MAIN_PARAM.get(a.action)
            shown = {main: a.params[main]} if main is not None and main in a.params else {}
        keyed.append((a.at, 2 * i + 1, _row("+", a.at, a.rule, a.action, a.node, shown)))
    keyed.sort(key=lambda k: (k[0], k[1]))
    rows = [k[2] for k in keyed]
    bad = [_row("!", a.at, a.rule, a.action, a.node, _pick(a, exp.params)) for exp, a in forbidden]
    lines = _table(rows + bad)
    report = [f"FAIL {source}:{case.line}: {spec.name}"]
    if rows:
        report.append("  (-: expected, not decided   +: decided, not expected)")
        report.extend(lines[: len(rows)])
    if bad:
        report.append("  (!: decided, but expect_none forbids it)")
        report.extend(lines[len(rows) :])
    outcome.report = report
    return outcome


def _pick(action: ActualAction, keys: Mapping[str, Any]) -> dict[str, Any]:
    return {k: action.params.get(k) for k in keys}


def run_test_files(files: Sequence[Path], out: TextIO) -> int:
    """Run every test in ``files``; print failures with their diff and ``N passed, N failed``. Returns 0
    when all pass, 1 when a test fails or a file has problems."""
    passed = failed = broken = 0
    for path in files:
        loaded, problems = load_test_file(path)
        if loaded is None:
            broken += 1
            for p in problems:
                out.write(f"{p}\n")
            continue
        for test in loaded.tests:
            result = run_case(test, loaded.rules, loaded.source)
            if result.passed:
                passed += 1
                out.write(f"ok   {loaded.source}:{result.line}: {result.name}\n")
            else:
                failed += 1
                out.write("\n".join(result.report) + "\n")
    summary = f"{passed} passed, {failed} failed"
    if broken:
        summary += f", {broken} file{'s' if broken > 1 else ''} with errors"
    if not files:
        summary = "no test files given"
    out.write(summary + "\n")
    return 0 if (files and failed == 0 and broken == 0) else 1
