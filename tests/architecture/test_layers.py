"""The direction of imports (docs/architecture.md): the vocabulary and the pure core never import an edge or
a shell, and the action domain reaches the world only through the integrations' protocols."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent.parent / "watchd"

BASE = ("watchd.strict", "watchd.errors", "watchd.clock", "watchd.logs")
#: package -> the modules it may import (prefixes), besides itself and BASE
ALLOWED: dict[str, tuple[str, ...]] = {
    "model": ("watchd.xid", "watchd.gpu.model"),
    "xid": ("watchd.model",),
    "jobs": ("watchd.model",),
    "fleetview": ("watchd.model",),  # issue 17: the whole fleet's drains and the hot spares, pure
    "detect": ("watchd.model", "watchd.xid", "watchd.jobs"),
    "reliability": ("watchd.model", "watchd.xid"),  # issue 17: pure accounting and checkpoint advice
    # rules/model.py derives the rule schema from the action handler table
    "rules": ("watchd.model", "watchd.xid", "watchd.actions.handlers", "watchd.actions.handler"),
    "store": ("watchd.model", "watchd.actions.audit"),
    # actions record into the engine's metrics object; the world only through the integrations' protocols
    "actions": (
        "watchd.model",
        "watchd.rules",
        "watchd.store",
        "watchd.engine.metrics",
        "watchd.integrations.base",
        "watchd.integrations.alerts",
        "watchd.integrations.leadership",
        "watchd.integrations.webhook.sender",
    ),
    # issue 21: the checks are a domain like actions: parsers, judge, plan and params are pure (model only);
    # the service keeps rounds on APScheduler (periodic) and in the state database; the runners are built by
    # name from the integrations (never imported here); the CLI calls the engine's API (operator_cli)
    "checks": ("watchd.model", "watchd.store", "watchd.periodic", "watchd.operator_cli"),
}


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in found if name == "watchd" or name.startswith("watchd.")]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_down(package: str) -> None:
    allowed = (f"watchd.{package}", *BASE, *ALLOWED[package])
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for line, name in imports_of(path)
        if not any(name == a or name.startswith(a + ".") for a in allowed)
    ]
    assert wrong == [], f"watchd.{package} imports up the layers:\n" + "\n".join(wrong)


def test_only_the_simulator_the_cli_and_registries_import_the_simulation() -> None:
    importers = {
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if not path.is_relative_to(PACKAGE / "sim")
        and any(name.startswith("watchd.sim") for _, name in imports_of(path))
    }
    assert importers <= {"watchd/cli.py", "watchd/gpu/registry.py", "watchd/sources/registry.py"}, importers
