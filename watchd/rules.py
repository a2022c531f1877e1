"""Remediation rules: loaded strictly from YAML, evaluated as pure functions over events.

A rule file holds ``rules:``, a list of rules. A rule matches an event when every key of its ``match``
holds (AND); ``any:`` inside a match is a list of alternative matches (OR). A key compares a field of the
event (``kind``, ``node``, ``source`` or any attribute such as ``xid``) with a scalar (equality) or with
an operator mapping: ``in``, ``not_in``, ``regex``, ``gt``, ``ge``, ``lt``, ``le``, ``exists``.
Actions are ``drain`` (with a ``reason`` template), ``requeue`` and ``log``; templates substitute
``{field}`` from the event and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from watchd.config import format_validation_error, load_yaml
from watchd.errors import ConfigError
from watchd.events import Event, Scalar

ActionKind = Literal["drain", "requeue", "log"]
DISRUPTIVE: frozenset[str] = frozenset({"drain", "requeue"})

_TEMPLATE_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TEMPLATE_BAD = re.compile(r"\{(?![A-Za-z_][A-Za-z0-9_]*\})")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Template(str):
    """A string with ``{field}`` placeholders, filled from the event; nothing else is interpreted."""

    def render(self, event: Event) -> str:
        def fill(m: re.Match[str]) -> str:
            value = event.get(m.group(1))
            return "?" if value is None else str(value)

        return _TEMPLATE_FIELD.sub(fill, self)


def _check_template(value: str) -> str:
    if _TEMPLATE_BAD.search(value):
        raise ValueError("a template may only hold {field} placeholders (letters, digits, _)")
    return value


class DrainParams(_Strict):
    reason: str = "{kind} on {node}"

    _check = field_validator("reason")(_check_template)


class LogParams(_Strict):
    message: str = "{kind} on {node}"

    _check = field_validator("message")(_check_template)


class RequeueParams(_Strict):
    pass


class ActionSpec(_Strict):
    drain: DrainParams | None = None
    requeue: RequeueParams | None = None
    log: LogParams | None = None

    @property
    def kind(self) -> ActionKind:
        for name in ("drain", "requeue", "log"):
            if getattr(self, name) is not None:
                return name
        raise AssertionError("validated ActionSpec has no action")


_OPERATORS = frozenset({"in", "not_in", "regex", "gt", "ge", "lt", "le", "exists"})


class RuleSpec(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str = ""
    severity: Literal["info", "warning", "critical"] = "warning"
    labels: dict[str, str] = Field(default_factory=dict)
    match: dict[str, Any]
    actions: list[ActionSpec] = Field(min_length=1)

    @field_validator("actions", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        # "- requeue" is shorthand for "- requeue: {}"; each item must name exactly one action.
        if not isinstance(value, list):
            return value
        out = []
        for i, item in enumerate(value):
            if isinstance(item, str):
                item = {item: {}}
            if isinstance(item, dict):
                if len(item) != 1:
                    raise ValueError(f"action {i}: name exactly one action, got {sorted(item)}")
                item = {k: ({} if v is None else v) for k, v in item.items()}
            out.append(item)
        return out


class RuleFile(_Strict):
    rules: list[RuleSpec]


# ---------------------------------------------------------------------------------------------- matching

Predicate = Callable[[Event], bool]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _compile_operator(name: str, op: str, arg: Any, where: str) -> Predicate:
    if op in ("in", "not_in"):
        if not isinstance(arg, list):
            raise ConfigError(f"{where}: '{op}' takes a list")
        options = frozenset(arg)
        if op == "in":
            return lambda e: e.get(name) in options
        return lambda e: e.get(name) not in options
    if op == "regex":
        if not isinstance(arg, str):
            raise ConfigError(f"{where}: 'regex' takes a string")
        try:
            pattern = re.compile(arg)
        except re.error as exc:
            raise ConfigError(f"{where}: bad regex {arg!r}: {exc}") from None

        def regex(e: Event) -> bool:
            value = e.get(name)
            return value is not None and pattern.search(str(value)) is not None

        return regex
    if op == "exists":
        if not isinstance(arg, bool):
            raise ConfigError(f"{where}: 'exists' takes true or false")
        return lambda e: (e.get(name) is not None) == arg
    bound = _number(arg)
    if bound is None:
        raise ConfigError(f"{where}: '{op}' takes a number")
    compare: Callable[[float, float], bool] = {
        "gt": float.__gt__,
        "ge": float.__ge__,
        "lt": float.__lt__,
        "le": float.__le__,
    }[op]

    def numeric(e: Event) -> bool:
        value = _number(e.get(name))
        return value is not None and compare(value, bound)

    return numeric


def compile_match(match: Mapping[str, Any], where: str) -> Predicate:
    """Compile a match mapping once, at load, into one predicate."""
    checks: list[Predicate] = []
    for key, cond in match.items():
        here = f"{where}.{key}"
        if key == "any":
            if not isinstance(cond, list) or not cond or not all(isinstance(c, dict) for c in cond):
                raise ConfigError(f"{here}: 'any' takes a non-empty list of matches")
            alternatives = [compile_match(c, f"{here}[{i}]") for i, c in enumerate(cond)]
            checks.append(lambda e, alts=alternatives: any(a(e) for a in alts))  # type: ignore[misc]
        elif isinstance(cond, dict):
            unknown = set(cond) - _OPERATORS
            if unknown or not cond:
                raise ConfigError(f"{here}: unknown operator {sorted(unknown)}; use {sorted(_OPERATORS)}")
            checks.extend(_compile_operator(key, op, arg, f"{here}.{op}") for op, arg in cond.items())
        elif cond is None or isinstance(cond, str | int | float | bool):
            checks.append(lambda e, k=key, v=cond: e.get(k) == v)  # type: ignore[misc]
        else:
            raise ConfigError(f"{here}: expected a value or an operator mapping")
    return lambda e: all(c(e) for c in checks)


# ---------------------------------------------------------------------------------------------- rule set


@dataclass(frozen=True, slots=True)
class Rule:
    spec: RuleSpec
    source: str
    matches: Predicate

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True, slots=True)
class PlannedAction:
    """One action a rule asks for, with its templates rendered for one event."""

    kind: ActionKind
    node: str
    params: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    rule: str
    severity: str
    event: Event
    actions: tuple[PlannedAction, ...]


def plan(spec: RuleSpec, event: Event) -> tuple[PlannedAction, ...]:
    out = []
    for action in spec.actions:
        if action.drain is not None:
            params: dict[str, Scalar] = {"reason": Template(action.drain.reason).render(event)}
        elif action.log is not None:
            params = {"message": Template(action.log.message).render(event)}
        else:
            params = {}
        out.append(PlannedAction(kind=action.kind, node=event.node, params=params))
    return tuple(out)


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]

    def evaluate(self, event: Event) -> list[Decision]:
        """Every rule that matches ``event``, in file order, with its actions planned."""
        return [
            Decision(rule.name, rule.spec.severity, event, plan(rule.spec, event))
            for rule in self.rules
            if rule.matches(event)
        ]

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rules]


def parse_rules(data: Any, source: str) -> list[Rule]:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a rule file is a mapping with a 'rules' list")
    try:
        parsed = RuleFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None
    return [
        Rule(spec, source, compile_match(spec.match, f"{source}: rules[{i}] ({spec.name}): match"))
        for i, spec in enumerate(parsed.rules)
    ]


def _rule_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    return [path]


def default_rules_text() -> str:
    return resources.files("watchd.data").joinpath("xid.yaml").read_text()


def load_rules(paths: Sequence[Path]) -> RuleSet:
    """Build a complete rule set from files and folders (embedded defaults when none are given).

    Raises ConfigError naming the file and rule on the first problem; nothing is half-loaded."""
    import yaml

    rules: list[Rule] = []
    if not paths:
        rules.extend(parse_rules(yaml.safe_load(default_rules_text()), "<embedded rules/xid.yaml>"))
    for path in paths:
        if not path.exists():
            raise ConfigError(f"{path}: rule file not found")
        for file in _rule_files(path):
            rules.extend(parse_rules(load_yaml(file), str(file)))
    seen: dict[str, str] = {}
    for rule in rules:
        if rule.name in seen:
            raise ConfigError(
                f"{rule.source}: duplicate rule name {rule.name!r} (first in {seen[rule.name]})"
            )
        seen[rule.name] = rule.source
    return RuleSet(tuple(rules))
