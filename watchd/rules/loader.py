"""Load rule files strictly into a :class:`~watchd.rules.rule_set.RuleSet`: every problem is reported with
file:line:column, nothing is half-loaded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from watchd.errors import ConfigError
from watchd.rules.compiled.match import compile_match
from watchd.rules.model import ACTION_NAMES, RuleSpec
from watchd.rules.positions import YamlPath, YamlPositions, load_with_position
from watchd.rules.rule import Rule
from watchd.rules.rule_set import RuleSet
from watchd.rules.specification import MatchError, match_kinds
from watchd.rules.template import Template, TemplateError, allowed_names

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


def parse_rule_file(text: str, source: str, first_order: int = 0) -> tuple[list[Rule], list[Problem]]:
    """Every rule of one file that is valid, and every problem found (all of them, not just the first)."""
    pos = YamlPositions(text)

    def problem(path: YamlPath, message: str, key: bool = False) -> Problem:
        line, col = pos.of(path, key)
        return Problem(source, line, col, message)

    data, error = load_with_position(text)
    if error is not None:
        return [], [Problem(source, *error)]
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        return [], [problem((), "a rule file is a mapping with a 'rules' list")]
    extra = sorted(set(data) - {"rules"})
    problems = [problem((k,), f"{k}: unknown key", key=True) for k in extra]
    rules: list[Rule] = []
    named: list[tuple[str, YamlPath]] = []  # every named item, valid or not: a broken rule's name is taken
    for i, item in enumerate(data["rules"]):
        at: YamlPath = ("rules", i)
        name = item.get("name") if isinstance(item, dict) else None
        label = f"rule {name!r}" if isinstance(name, str) else f"rules[{i}]"
        if isinstance(name, str):
            named.append((name, at))
        try:
            spec = RuleSpec.model_validate(item)
        except ValidationError as exc:
            for err in exc.errors():
                loc = tuple(err["loc"])
                unknown = err["type"] == "extra_forbidden"
                where = ".".join(str(p) for p in loc) or "(rule)"
                msg = "unknown key" if unknown else err["msg"].removeprefix("Value error, ")
                if unknown and len(loc) == 3 and loc[0] == "actions":
                    msg = f"unknown action {loc[2]!r}; use one of {', '.join(ACTION_NAMES)}"
                    where = f"actions.{loc[1]}"
                problems.append(problem((*at, *loc), f"{label}: {where}: {msg}", key=unknown))
            continue
        try:
            matches = compile_match(spec.match)
        except MatchError as exc:
            problems.append(problem((*at, "match", *exc.path), f"{label}: match: {exc}"))
            continue
        unless = None
        if spec.unless is not None:
            try:
                unless = compile_match(spec.unless.match)
            except MatchError as exc:
                problems.append(problem((*at, "unless", "match", *exc.path), f"{label}: unless: {exc}"))
                continue
        allowed = allowed_names(match_kinds(spec.match)) | frozenset(spec.group_by)
        templates: list[dict[str, Any]] = []
        bad = False
        for j, action in enumerate(spec.actions):
            try:
                fields = _template_fields(action.params)
            except TemplateError as exc:
                problems.append(problem((*at, "actions", j), f"{label}: actions[{j}] {action.kind}: {exc}"))
                bad = True
                continue
            for pname, value in fields.items():
                for t in value.values() if isinstance(value, dict) else [value]:
                    if isinstance(t, Template) and (unknown_names := sorted(t.names - allowed)):
                        problems.append(
                            problem(
                                (*at, "actions", j, action.kind, pname),
                                f"{label}: actions[{j}] {action.kind}.{pname}: unknown field "
                                f"{', '.join(unknown_names)} in template",
                            )
                        )
                        bad = True
            templates.append(fields)
        if bad:
            continue
        line, _ = pos.of(at)
        rules.append(
            Rule(
                spec,
                f"{source}:{line}",
                matches,
                unless,
                tuple(templates),
                order=first_order + len(rules),
            )
        )
    problems += _duplicates_with_a_broken_rule(named, {r.source for r in rules}, source, pos)
    return rules, problems


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


def check_rules(paths: Sequence[Path]) -> tuple[list[Rule], list[Problem]]:
    """All valid rules and all problems across ``paths`` (embedded defaults when empty)."""
    rules: list[Rule] = []
    problems: list[Problem] = []
    sources: list[tuple[str, str]] = []
    if not paths:
        sources.extend(default_rules())
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
    for text, source in sources:
        found, bad = parse_rule_file(text, source, first_order=len(rules))
        rules.extend(found)
        problems.extend(bad)
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
    return rules, problems


def load_rules(paths: Sequence[Path]) -> RuleSet:
    """Build a complete rule set, or raise ConfigError listing every problem."""
    rules, problems = check_rules(paths)
    if problems:
        raise ConfigError("\n".join(str(p) for p in problems))
    return RuleSet(tuple(rules))
