"""The table of action handlers: every module of this package that exports ``HANDLER`` is one action kind,
and everything that knows about actions (the rule schema, the executor) reads this table."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping

from watchd.actions.handler import ActionHandler


def _discover() -> dict[str, ActionHandler]:
    found: dict[str, ActionHandler] = {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        handler: ActionHandler | None = getattr(
            importlib.import_module(f"{__name__}.{module.name}"), "HANDLER", None
        )
        if handler is None:
            continue
        if handler.kind in found:
            raise RuntimeError(f"two handlers for the action {handler.kind!r}")
        found[handler.kind] = handler
    return found


HANDLERS: Mapping[str, ActionHandler] = _discover()


def handler_for(kind: str) -> ActionHandler:
    try:
        return HANDLERS[kind]
    except KeyError:
        raise ValueError(f"unknown action {kind!r}; use one of {', '.join(HANDLERS)}") from None
