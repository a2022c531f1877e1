"""What the interpreter (:mod:`watchd.rules.specification`), the template context and the fast path's planner
read of a loaded rule, as a protocol: they sit below :class:`watchd.rules.rule.Rule`, which is built from
them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from watchd.rules.model import RuleSpec

__all__ = ["RuleView"]


class RuleView(Protocol):
    @property
    def spec(self) -> RuleSpec: ...
    @property
    def name(self) -> str: ...
    @property
    def templates(self) -> tuple[Mapping[str, Any], ...]: ...
    @property
    def stateful(self) -> bool: ...
    @property
    def order(self) -> int: ...
