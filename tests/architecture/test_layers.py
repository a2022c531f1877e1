"""The direction of imports (docs/architecture.md): every package and top-level module of watchd has its place
in one order, from the base up to the command line; a unit imports only units below it, but for the few
exceptions named here with their reason (and in docs/architecture.md); and no modules import each other in a
loop, ``if TYPE_CHECKING:`` imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent.parent / "watchd"

#: every package and top-level module, from the bottom of the house to the top
ORDER: tuple[str, ...] = (
    # the base
    "strict",
    "errors",
    "clock",
    "logs",
    "untrusted",  # opening and reading files the cluster's users control
    "extras",  # names the optional extra an import needs
    "progress",  # a command's progress line on a terminal
    "yamlfile",  # YAML read strictly (no key twice), with positions and "did you mean"
    "shortlist",  # a long list shown by its first items and how many more
    # the vocabulary: one typed class per event kind, the wire format, the Xid catalog, settings types; the
    # shipped rule pack (data)
    "data",
    "model",
    "xid",
    "http_settings",
    "credentials",
    # small shared pieces: the subsystem protocol, APScheduler, aiohttp helpers, the training-side client
    "subsystem",
    "port",  # a port's verbs (which change the cluster, what they need) and the one gate over any port
    "periodic",
    "slices",  # long work on the event loop in slices (pure code yields; the edge drives it)
    "httputil",
    "client",
    "systemd",
    # the pure core and the domains, each with its service (a subsystem of the engine) on top of its core
    "jobs",
    "trainlog",
    "rules",
    "detect",
    "store",
    "reliability",
    "checks",
    # the edges: integrations implement the domains' protocols; the action pipeline reaches the world
    # through the integrations' own protocols
    "integrations",
    "actions",
    "gpu",
    "ib",  # InfiniBand/RoCE ports: parse and judge (pure), read sysfs, the agent's collector
    "sources",
    "reports",
    "fleetview",
    # the shells: the daemons, the config that composes every section, the command line
    "security",
    "agent",
    "config",
    "reach",  # how a command reaches a running engine: address, token, TLS; the HTTP client
    "operator_cli",
    "checks_cli",
    "drains_cli",
    "reliability_cli",
    "engine",
    "sim",
    "cli_parser",  # the command line's grammar
    "completion",  # shell completion generated from it
    "cli",
    "__main__",
)

#: unit -> the imports of a unit above it that it may make, each with its reason
UPWARD: dict[str, dict[str, str]] = {
    "model": {
        "watchd.gpu.model": "the GPU sample is vocabulary: a plain dataclass the conditions table describes",
        "watchd.xid": "the Xid catalog and PCI addresses are pure data the events and conditions read",
    },
    "rules": {
        "watchd.actions.handlers": "the rule schema and its JSON Schema derive from the action handler table",
        "watchd.actions.handler": "... and from each handler's parameter class",
    },
    "store": {"watchd.actions.audit": "the audit record the store persists is the action pipeline's type"},
    "actions": {"watchd.engine.metrics": "the pipeline counts into the engine's Prometheus metrics object"},
    "gpu": {"watchd.sim": "the backend registry builds the simulated GPUs by name, as the other backends"},
}


def unit_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, what is imported): a module, or ``module.name`` for ``from module import name``."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in found if name.startswith("watchd.")]


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_unit_has_its_place() -> None:
    units = {unit_of(p) for p in SOURCES} - {"__init__"}
    assert units - set(ORDER) == set(), "place these in ORDER (and in docs/architecture.md)"
    assert set(ORDER) - units == set(), "ORDER names units that are gone"


@pytest.mark.parametrize("unit", ORDER)
def test_imports_point_down(unit: str) -> None:
    below = set(ORDER[: ORDER.index(unit) + 1])
    allowed_up = UPWARD.get(unit, {})
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in SOURCES
        if unit_of(path) == unit
        for line, name in imports_of(path)
        if name.split(".")[1] in ORDER  # else a name of watchd/__init__.py (the version): the bottom
        and name.split(".")[1] not in below
        and not any(name == a or name.startswith(a + ".") for a in allowed_up)
    ]
    assert wrong == [], f"watchd.{unit} imports up the house:\n" + "\n".join(wrong)


def _module(name: str) -> Path | None:
    """The file an import names: a module, or a package's __init__; None for a name inside a module."""
    base = PACKAGE.parent / Path(*name.split("."))
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    return None


def test_no_modules_import_each_other_in_a_loop() -> None:
    graph: dict[Path, set[Path]] = {}
    for path in SOURCES:
        targets: set[Path] = set()
        for _, name in imports_of(path):
            target = _module(name) or _module(name.rpartition(".")[0])  # a module, or a name in one
            if target is not None and target != path:
                targets.add(target)
        graph[path] = targets
    # Tarjan's strongly connected components: a component of more than one file is a loop
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    loops: list[list[str]] = []

    def visit(v: Path) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(str(w.relative_to(PACKAGE.parent)))
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert loops == [], "modules that import each other in a loop: " + "; ".join(", ".join(c) for c in loops)


def test_only_the_simulator_the_cli_and_registries_import_the_simulation() -> None:
    importers = {
        str(path.relative_to(PACKAGE.parent))
        for path in SOURCES
        if not path.is_relative_to(PACKAGE / "sim")
        and any(name.startswith("watchd.sim") for _, name in imports_of(path))
    }
    assert importers <= {"watchd/cli.py", "watchd/gpu/registry.py", "watchd/sources/registry.py"}, importers


def test_no_module_over_600_lines() -> None:
    """Short modules with one job: a module that grows past this is split (docs/architecture.md)."""
    long = {
        str(p.relative_to(PACKAGE.parent)): n for p in SOURCES if (n := len(p.read_text().splitlines())) > 600
    }
    assert long == {}, long
