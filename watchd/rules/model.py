"""The rule file schema (pydantic): strict, documented, and exported as JSON Schema for editors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from watchd.actions.handlers import HANDLERS
from watchd.rules.durations import Duration
from watchd.rules.limits import Mode, RateLimit
from watchd.strict import Strict as _Strict

#: The action kinds, in the order of the handler table (watchd.actions.handlers): rules derive from it.
ACTION_NAMES: tuple[str, ...] = tuple(kind for kind, handler in HANDLERS.items() if handler.rule_action)
_RULE_HANDLERS = {kind: HANDLERS[kind] for kind in ACTION_NAMES}
DISRUPTIVE: frozenset[str] = frozenset(kind for kind, handler in HANDLERS.items() if handler.disruptive)
if TYPE_CHECKING:
    ActionKind = str
else:
    ActionKind = Literal[ACTION_NAMES]  # validated (and listed in the schema) as the table's names


class _OneAction(_Strict):
    """Exactly one action per list item."""

    @model_validator(mode="after")
    def _exactly_one(self) -> _OneAction:
        given = [k for k in ACTION_NAMES if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"name exactly one action of {', '.join(ACTION_NAMES)}")
        return self

    @property
    def kind(self) -> ActionKind:
        for name in ACTION_NAMES:
            if getattr(self, name) is not None:
                return name
        raise AssertionError("unreachable: validated")

    @property
    def params(self) -> BaseModel:
        value = getattr(self, self.kind)
        assert isinstance(value, BaseModel)
        return value


# One optional field per handler, named by its kind: "- drain: {reason: ...}".
if TYPE_CHECKING:
    ActionSpec = _OneAction
else:
    ActionSpec = create_model(
        "ActionSpec",
        __base__=_OneAction,
        __doc__=_OneAction.__doc__,
        **{kind: (handler.params | None, None) for kind, handler in _RULE_HANDLERS.items()},
    )


class UnlessSpec(_Strict):
    """Suppress the rule when another event matching ``match`` was seen in the same group within ``within``
    before (e.g. Xid 45 right after another Xid on the same GPU)."""

    match: dict[str, Any]
    within: Duration


class RuleSpec(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", description="unique across all rule files")]
    replaces: Literal["default"] | None = Field(
        None, description="'default': this rule takes the place of the default rule of the same name"
    )
    description: str = ""
    severity: Literal["info", "warning", "critical"] = "warning"
    labels: dict[str, str] = Field(default_factory=dict)
    match: dict[str, Any] = Field(
        description="field: value or {operator: argument}; all must hold; any: [..] is OR"
    )
    group_by: list[str] = Field(
        default_factory=lambda: ["node"], description="fields that make a group (node, gpu, job, ...)"
    )
    count: Annotated[int, Field(ge=1)] = Field(1, description="matching events needed within the window")
    window: Duration | None = Field(None, description="sliding window for count (required when count > 1)")
    distinct: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, description="at least N different values of a field among the counted events"
    )
    for_: Duration | None = Field(None, alias="for", description="the match must hold this long in the group")
    unless: UnlessSpec | None = None
    cooldown: Duration = Field(0.0, description="after firing, the group stays quiet this long")
    mode: Mode | None = Field(None, description="dry-run here even when the engine enforces")
    rate_limit: RateLimit | None = None
    actions: list[ActionSpec] = Field(min_length=1)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("actions", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        # "- requeue" is shorthand for "- requeue: {}", and "- drain:" (null) for "- drain: {}".
        if not isinstance(value, list):
            return value
        out = []
        for item in value:
            if isinstance(item, str):
                item = {item: {}}
            elif isinstance(item, dict):
                item = {k: ({} if v is None else v) for k, v in item.items()}
            out.append(item)
        return out

    @model_validator(mode="after")
    def _coherent(self) -> RuleSpec:
        if self.count > 1 and self.window is None:
            raise ValueError("count > 1 needs a window")
        if self.distinct and self.window is None:
            raise ValueError("distinct needs a window")
        if self.for_ is not None and (self.count > 1 or self.distinct):
            raise ValueError("use either for or count/distinct, not both")
        if not self.group_by:
            raise ValueError("group_by needs at least one field")
        return self


class RuleFile(_Strict):
    rules: list[RuleSpec] = Field(default_factory=list)
    disable_defaults: list[str] = Field(
        default_factory=list, description="default rules (by name) this site turns off"
    )


_SCALAR: dict[str, Any] = {"type": ["string", "number", "boolean", "null"]}
_NUMBER: dict[str, Any] = {"type": "number"}
#: A match as docs/rules.md describes it (the models keep it a plain mapping: compile_match checks it).
_MATCH_DEFS: dict[str, Any] = {
    "Match": {
        "type": "object",
        "description": "field: value or {operator: argument}; all must hold; any: [..] is OR",
        "properties": {"any": {"type": "array", "items": {"$ref": "#/$defs/Match"}, "minItems": 1}},
        "additionalProperties": {"anyOf": [_SCALAR, {"$ref": "#/$defs/Condition"}]},
    },
    "Condition": {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {
            "in": {"type": "array", "items": _SCALAR},
            "not_in": {"type": "array", "items": _SCALAR},
            "regex": {"type": "string"},
            "exists": {"type": "boolean"},
            "gt": _NUMBER,
            "ge": _NUMBER,
            "lt": _NUMBER,
            "le": _NUMBER,
        },
    },
}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a rule file, for editors (``watchd rules schema``): the models' schema with the
    match language and the action shorthands (``- requeue``) the models accept through validators."""
    schema = RuleFile.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "watchd rule file"
    defs = schema["$defs"]
    defs.update(_MATCH_DEFS)
    rule = defs["RuleSpec"]["properties"]
    rule["match"] = {"$ref": "#/$defs/Match"}
    defs["UnlessSpec"]["properties"]["match"] = {"$ref": "#/$defs/Match"}
    shorthand = {"enum": list(ACTION_NAMES), "description": "an action with its defaults"}
    rule["actions"]["items"] = {"anyOf": [rule["actions"]["items"], shorthand]}
    defs["ActionSpec"].update(minProperties=1, maxProperties=1)
    return schema
