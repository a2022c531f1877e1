"""Read and parse rule files strictly: every problem is reported with file:line:column, nothing is
half-loaded. How the default pack and a site's files make the engine's set: :mod:`watchd.rules.effective`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from watchd.errors import ConfigError
from watchd.rules.compiled.match import Predicate, compile_match
from watchd.rules.model import ACTION_NAMES, RuleSpec
from watchd.rules.positions import YamlPath, YamlPositions, load_with_position
from watchd.rules.rule import Rule
from watchd.rules.specification import MatchError, match_kinds
from watchd.rules.template import Template, TemplateError, allowed_names
from watchd.yamlfile import keys_at, suggestion

EMBEDDED = "<embedded rules>"


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


def _read(path: Path) -> str | Problem:
    """The file's text, or the problem that stops it being read (a dangling link, bytes that are not
    UTF-8: named with the file, where in it)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        if path.is_symlink() and not path.exists():
            return Problem(str(path), 1, 1, f"dangling link to {path.readlink()}: its target does not exist")
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        return Problem(
            str(path), line, column, f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}"
        )


def _template_fields(model: BaseModel) -> dict[str, Any]:
    """The action's string parameters as templates (nested mappings of strings too), others as they are."""
    out: dict[str, Any] = {}
    for name, value in model:
        if name in ("url",):  # a webhook URL is not a template
            out[name] = value
        elif isinstance(value, str):
            out[name] = Template(value)
        elif isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            out[name] = {k: Template(v) for k, v in value.items()} if name == "labels" else value
        else:
            out[name] = value
    return out


@dataclass(frozen=True, slots=True)
class DisabledDefault:
    """One entry of a rule file's ``disable_defaults`` list: the default rule's name, and where it is."""

    name: str
    file: str
    line: int
    column: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class ParsedFile:
    rules: list[Rule]
    problems: list[Problem]
    disabled: list[DisabledDefault]


def parse_rule_file(text: str, source: str, first_order: int = 0) -> tuple[list[Rule], list[Problem]]:
    """Every rule of one file that is valid, and every problem found (all of them, not just the first)."""
    parsed = parse_rule_file_in_full(text, source, first_order)
    return parsed.rules, parsed.problems


def parse_rule_file_in_full(text: str, source: str, first_order: int = 0) -> ParsedFile:
    """:func:`parse_rule_file`, with the default rules the file disables (``disable_defaults``)."""
    pos = YamlPositions(text)

    def problem(path: YamlPath, message: str, key: bool = False) -> Problem:
        line, col = pos.of(path, key)
        return Problem(source, line, col, message)

    data, error = load_with_position(text)
    if error is not None:
        return ParsedFile([], [Problem(source, *error)], [])
    if not isinstance(data, dict) or not isinstance(data.get("rules", []), list) or not data:
        return ParsedFile([], [problem((), "a rule file is a mapping with a 'rules' list")], [])
    extra = sorted(set(data) - {"rules", "disable_defaults"})
    problems = [problem((k,), f"{k}: unknown key", key=True) for k in extra]
    disabled: list[DisabledDefault] = []
    names = data.get("disable_defaults", [])
    if not isinstance(names, list):
        problems.append(problem(("disable_defaults",), "disable_defaults: a list of default rule names"))
        names = []
    for i, name in enumerate(names):
        if isinstance(name, str):
            disabled.append(DisabledDefault(name, source, *pos.of(("disable_defaults", i))))
        else:
            problems.append(problem(("disable_defaults", i), f"disable_defaults[{i}]: a rule name (text)"))
    rules: list[Rule] = []
    named: list[tuple[str, YamlPath]] = []  # every named item, valid or not: a broken rule's name is taken
    for i, item in enumerate(data.get("rules", [])):
        at: YamlPath = ("rules", i)
        name = item.get("name") if isinstance(item, dict) else None
        label = f"rule {name!r}" if isinstance(name, str) else f"rules[{i}]"
        if isinstance(name, str):
            named.append((name, at))
        before = len(problems)

        def report(path: YamlPath, message: str, key: bool = False) -> None:
            problems.append(problem(path, message, key))

        rule = _rule(item, at, label, report)
        if rule is not None and len(problems) == before:
            spec, matches, unless, templates = rule
            line, _ = pos.of(at)
            rules.append(
                Rule(spec, f"{source}:{line}", matches, unless, templates, order=first_order + len(rules))
            )
    problems += _duplicates_with_a_broken_rule(named, {r.source for r in rules}, source, pos)
    problems.sort(key=lambda p: (p.line, p.column))  # in the file's order
    return ParsedFile(rules, problems, disabled)


#: what a broken required key is replaced with, so that the rest of the rule is checked too
_STAND_INS: dict[str, Any] = {"name": "x", "match": {}, "actions": ["requeue"]}
Report = Callable[..., None]


def _validate(item: Any, label: str, at: YamlPath, report: Report) -> tuple[RuleSpec | None, set[str]]:
    """The rule's spec, or the spec of the rest of it (its broken keys left out or stood in for) with the
    keys that are broken; every problem reported."""
    try:
        return RuleSpec.model_validate(item), set()
    except ValidationError as exc:
        broken: set[str] = set()
        for err in exc.errors():
            loc = tuple(err["loc"])
            unknown = err["type"] == "extra_forbidden"
            where = ".".join(str(p) for p in loc) or "(rule)"
            msg = "unknown key" if unknown else err["msg"].removeprefix("Value error, ")
            if unknown and len(loc) == 3 and loc[0] == "actions":
                msg = f"unknown action {loc[2]!r}; use one of {', '.join(ACTION_NAMES)}"
                where = f"actions.{loc[1]}"
            elif unknown:
                msg += suggestion(str(loc[-1]), keys_at(RuleSpec, loc[:-1]))
            report((*at, *loc), f"{label}: {where}: {msg}", key=unknown)
            broken.add(str(loc[0]) if loc else "")
    if "" in broken or not isinstance(item, dict):
        return None, broken  # a check of the whole rule failed: nothing more to check apart
    rest = {k: v for k, v in item.items() if k not in broken}
    rest |= {k: v for k, v in _STAND_INS.items() if k in broken}
    try:
        return RuleSpec.model_validate(rest), broken
    except ValidationError:  # a check across keys (count needs a window, ...): reported already
        return None, broken


def _rule(
    item: Any, at: YamlPath, label: str, report: Report
) -> tuple[RuleSpec, Predicate, Predicate | None, tuple[dict[str, Any], ...]] | None:
    """One rule compiled, or None; every problem of it reported, also those behind the first one."""
    spec, broken = _validate(item, label, at, report)
    matches = unless = None
    if isinstance(item, dict) and "match" not in broken and isinstance(item.get("match"), dict):
        try:
            matches = compile_match(item["match"])
        except MatchError as exc:
            report((*at, "match", *exc.path), f"{label}: match: {exc}")
    raw_unless = item.get("unless") if isinstance(item, dict) else None
    if isinstance(raw_unless, dict) and isinstance(raw_unless.get("match"), dict):
        try:
            unless = compile_match(raw_unless["match"])
        except MatchError as exc:
            report((*at, "unless", "match", *exc.path), f"{label}: unless: {exc}")
            unless = None
    if spec is None or broken & {"actions", "group_by", "match"}:
        return None
    allowed = allowed_names(match_kinds(spec.match)) | frozenset(spec.group_by)
    templates: list[dict[str, Any]] = []
    for j, action in enumerate(spec.actions):
        try:
            fields = _template_fields(action.params)
        except TemplateError as exc:
            report((*at, "actions", j), f"{label}: actions[{j}] {action.kind}: {exc}")
            continue
        for pname, value in fields.items():
            for t in value.values() if isinstance(value, dict) else [value]:
                if isinstance(t, Template) and (unknown_names := sorted(t.names - allowed)):
                    report(
                        (*at, "actions", j, action.kind, pname),
                        f"{label}: actions[{j}] {action.kind}.{pname}: unknown field "
                        f"{', '.join(unknown_names)} in template",
                    )
        templates.append(fields)
    return None if matches is None else (spec, matches, unless, tuple(templates))


def _duplicates_with_a_broken_rule(
    named: list[tuple[str, YamlPath]], valid: set[str], source: str, pos: YamlPositions
) -> list[Problem]:
    """A name used twice in one file where one of the two rules is broken (check_rules reports the pairs of
    valid rules, across files): fixing the broken one must not be what reveals the clash."""
    out: list[Problem] = []
    first: dict[str, str] = {}
    for name, at in named:
        line, col = pos.of(at)
        here = f"{source}:{line}"
        if name in first and not (first[name] in valid and here in valid):
            out.append(Problem(source, line, col, f"duplicate rule name {name!r} (first at {first[name]})"))
        first.setdefault(name, here)
    return out


def rule_files(path: Path) -> list[Path]:
    """The rule files a configured path stands for: the ``*.yaml``/``*.yml`` files of a folder (a dangling
    link among them too, to be reported), or itself."""
    if path.is_dir():
        return sorted(
            p
            for p in path.iterdir()
            if p.suffix in (".yaml", ".yml") and (p.is_file() or (p.is_symlink() and not p.exists()))
        )
    return [path]


def default_rules() -> list[tuple[str, str]]:
    """The default rule pack shipped inside the package (the files ``rules/`` links to), as (text, name)."""
    folder = resources.files("watchd.data").joinpath("rules")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".yaml")), key=lambda f: f.name)
    return [(f.read_text(), f"<embedded rules/{f.name}>") for f in files]


def read_rule_files(paths: Sequence[Path]) -> tuple[list[tuple[str, str]], list[Problem]]:
    """The text of every rule file ``paths`` stand for, as (text, file name), and what stops one being read
    (a missing path, an empty folder, a dangling link, bytes that are not UTF-8)."""
    sources: list[tuple[str, str]] = []
    problems: list[Problem] = []
    for path in paths:
        if not path.exists():
            problems.append(Problem(str(path), 1, 1, "rule file not found"))
            continue
        files = rule_files(path)
        if path.is_dir() and not files:
            problems.append(Problem(str(path), 1, 1, "no *.yaml rule files in this folder"))
        for f in files:
            text = _read(f)
            if isinstance(text, Problem):
                problems.append(text)
            else:
                sources.append((text, str(f)))
    return sources, problems


def parse_sources(sources: Sequence[tuple[str, str]], first_order: int = 0) -> ParsedFile:
    """Every file of ``sources`` parsed, as one: a rule name used twice (across files too) is a problem."""
    rules: list[Rule] = []
    problems: list[Problem] = []
    disabled: list[DisabledDefault] = []
    for text, source in sources:
        parsed = parse_rule_file_in_full(text, source, first_order=first_order + len(rules))
        rules.extend(parsed.rules)
        problems.extend(parsed.problems)
        disabled.extend(parsed.disabled)
    seen: dict[str, Rule] = {}
    for rule in rules:
        if rule.name in seen:
            file, line = rule.source.rsplit(":", 1)
            problems.append(
                Problem(
                    file,
                    int(line),
                    1,
                    f"duplicate rule name {rule.name!r} (first at {seen[rule.name].source})",
                )
            )
        else:
            seen[rule.name] = rule
    return ParsedFile(rules, problems, disabled)


def check_rules(paths: Sequence[Path]) -> tuple[list[Rule], list[Problem]]:
    """All valid rules and all problems of exactly the files ``paths`` stand for (the embedded defaults when
    empty): what a rule unit test runs. The engine's set is :func:`watchd.rules.effective.effective_rules`."""
    sources, problems = read_rule_files(paths) if paths else (default_rules(), [])
    parsed = parse_sources(sources)
    return parsed.rules, problems + parsed.problems
