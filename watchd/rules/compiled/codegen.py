"""Generated Python for the rule engine's hot path (matches, index buckets, templates, action parameters,
group keys): a function call per condition or per field is most of what evaluating a rule costs in
CPython, so each is compiled once, at load, into one function.

The one rule that keeps this safe: generated source never holds text from a rule. Every value a rule
brings (field names, constants, template text, predicates) is bound in the namespace under a generated
name (``v0``, ``v1``, ...); the source names only those, the function's arguments and fixed identifiers.
"""

from __future__ import annotations

from typing import Any


class Namespace:
    def __init__(self, **fixed: Any) -> None:
        self._values: dict[str, Any] = dict(fixed)
        self._next = 0

    def bind(self, value: Any) -> str:
        """A name for ``value`` to use in the source."""
        name = f"v{self._next}"
        self._next += 1
        self._values[name] = value
        return name

    def define(self, source: str, name: str, filename: str) -> Any:
        """Compile ``source`` (a ``def name(...)``) over the bound values; the function."""
        exec(compile(source, filename, "exec"), self._values)  # generated: see the module docstring
        return self._values[name]
