"""What a rule's templates see (docs/rules.md, *Templates*): the specification of the template context.
The generated planners (watchd/rules/compiled/planner.py) inline what they can and fall back to it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from watchd.model.events import TOP_LEVEL_FIELDS, Event, Scalar
from watchd.rules.template import Template

if TYPE_CHECKING:
    from watchd.rules.rule_view import RuleView


class Context(Mapping[str, Any]):
    """What templates see, resolved on demand: the event's fields, ``event`` (the same), ``rule``,
    ``severity``, ``count`` and ``group``. Built per decision, costs nothing until a template asks."""

    __slots__ = ("_count", "_event", "_fields", "_group", "_rule")

    def __init__(self, rule: RuleView, event: Event, group: Mapping[str, Scalar], count: int) -> None:
        self._rule, self._event, self._group, self._count = rule, event, group, count
        self._fields: dict[str, Any] | None = None

    def fields(self) -> dict[str, Any]:
        if self._fields is None:
            e = self._event
            self._fields = {
                **e.attrs,
                "id": e.id,
                "node": e.node,
                "source": e.source,
                "kind": e.kind,
                "time": e.time,
            }
        return self._fields

    def __getitem__(self, name: str) -> Any:
        if name == "event":
            return self.fields()
        if name == "rule":
            return self._rule.name
        if name == "severity":
            return self._rule.spec.severity
        if name == "count":
            return self._count
        if name == "group":
            return dict(self._group)
        e = self._event
        if name in TOP_LEVEL_FIELDS:
            return getattr(e, name)
        if name in e.attrs:
            return e.attrs[name]
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        yield from self.fields()
        yield from ("event", "rule", "severity", "count", "group")

    def __len__(self) -> int:
        return len(self.fields()) + 5


def render_params(value: Any, ctx: Mapping[str, Any]) -> Any:
    """An action's parameters rendered through the full context: templates rendered (a field the event does
    not carry as ``?``), nested mappings as fresh dicts, other values as they are."""
    if isinstance(value, Template):
        return value.render(ctx)
    if isinstance(value, dict):
        return {k: render_params(v, ctx) for k, v in value.items()}
    return value
