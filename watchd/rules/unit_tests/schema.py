"""The keys of a rule test file (``watchd rules test``), strictly: an unknown key is an error."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from watchd.model.events import Scalar
from watchd.rules.durations import Duration
from watchd.rules.model import ActionKind
from watchd.rules.positions import YamlPath
from watchd.strict import Strict as _Strict

#: Times closer than this are equal (an expectation's ``at``, a parameter's number).
EPS = 1e-6


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


class EventSpec(_Strict):
    at: str | float
    node: str = Field(min_length=1)
    kind: str = Field(min_length=1)
    source: str = "test"
    id: str | None = None
    attrs: dict[str, Scalar] = Field(default_factory=dict)


class SpecError(ValueError):
    """A problem at ``path`` in the test file (``key``: at the key itself, not its value)."""

    def __init__(self, path: YamlPath, message: str, key: bool = False) -> None:
        super().__init__(message)
        self.path = path
        self.key = key
