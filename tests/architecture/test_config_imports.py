"""Loading a config imports no integration (docs/architecture.md): each config section lives with its owner,
in a small ``settings.py`` that imports only pydantic and watchd's vocabulary, and ``watchd.config`` composes
them. Reading a config loads no integration's library: a Slurm engine never loads the Kubernetes client."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent.parent / "watchd"

#: libraries that an integration or a backend needs, and the config never does
HEAVY = ("lightkube", "psycopg", "pynvml", "aiohttp")

#: the section modules, and what they may import of watchd: the vocabulary and the shared sections
SECTION_MODULES = sorted(
    [*PACKAGE.rglob("settings.py"), PACKAGE / "http_settings.py", PACKAGE / "credentials.py"]
)
VOCABULARY = (
    "watchd.strict",
    "watchd.errors",
    "watchd.logs",
    "watchd.model.durations",
    "watchd.model.ib",  # the InfiniBand counter table: the widths and default thresholds the section names
    "watchd.credentials",
    "watchd.http_settings",
    "watchd.integrations.settings",
    "watchd.gpu.settings",
)


def test_importing_the_config_imports_no_integration() -> None:
    code = (
        "import json, sys\n"
        "import watchd.config\n"
        "print(json.dumps({name: hasattr(module, '__path__') for name, module in sys.modules.items()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded: dict[str, bool] = json.loads(out)
    heavy = sorted({name.split(".")[0] for name in loaded} & set(HEAVY))
    assert heavy == [], f"importing watchd.config imports {', '.join(heavy)}"
    # of the integrations, only their packages (empty __init__) and their settings modules
    integrations = sorted(
        name
        for name, is_package in loaded.items()
        if name.startswith("watchd.integrations.") and not is_package and not name.endswith(".settings")
    )
    assert integrations == [], f"importing watchd.config imports {', '.join(integrations)}"


def _imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


@pytest.mark.parametrize("path", SECTION_MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_a_section_module_imports_only_pydantic_and_the_vocabulary(path: Path) -> None:
    def allowed(name: str) -> bool:
        top = name.split(".")[0]
        if top == "watchd":  # the vocabulary, or another section it is composed of
            return name.endswith(".settings") or any(
                name == v or name.startswith(v + ".") for v in VOCABULARY
            )
        return top in ("__future__", "pydantic") or top in sys.stdlib_module_names

    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for line, name in _imports(path)
        if not allowed(name)
    ]
    assert wrong == [], (
        "a config section module imports more than pydantic and the vocabulary:\n" + "\n".join(wrong)
    )
