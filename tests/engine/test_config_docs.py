"""The documentation cannot drift from the loader: every YAML example in the docs loads through the real
loader it is written for (engine or agent config, rule file, rule test file), and docs/configuration.md names
every key the strict config loader accepts, and no other."""

from __future__ import annotations

import re
import shutil
import textwrap
from io import StringIO
from pathlib import Path

import pytest
import yaml

from watchd.config import AgentConfig, EngineConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: examples that are not watchd's to load: (file, the first key of the block) -> what they are
NOT_WATCHD = {
    ("README.md", "scrape_configs"): "Prometheus's own config",
    ("heartbeats.md", "volumes"): "a Kubernetes pod spec fragment",
}


def yaml_blocks() -> list[tuple[str, int, str]]:
    """(file name, line, text) of every ```yaml block, indented ones (in a list item) included."""
    blocks = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = re.fullmatch(r"( *)```yaml\s*", lines[i])
            if fence is None:
                i += 1
                continue
            start, body = i + 1, []
            i += 1
            while not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((doc.name, start + 1, textwrap.dedent("\n".join(body)) + "\n"))
    return blocks


def _parts(text: str) -> list[tuple[str | None, str]]:
    """A block holding several files, each introduced by a ``# engine.yaml`` line: (the file's kind, text)."""
    parts: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in text.splitlines():
        named = re.fullmatch(r"# (engine|agent)\.yaml\s*", line)
        if named:
            parts.append((named.group(1), []))
        else:
            parts[-1][1].append(line)
    return [(kind, "\n".join(lines) + "\n") for kind, lines in parts if yaml.safe_load("\n".join(lines))]


def _load(kind: str | None, text: str, where: str, tmp_path: Path) -> str:
    """Load one example with the loader it is for; what it was taken for."""
    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"{where}: not a mapping"
    first = next(iter(data))
    name = where.split(":")[0]
    if (name, first) in NOT_WATCHD:
        return NOT_WATCHD[(name, first)]
    path = tmp_path / f"{where.replace(':', ' line ')}.yaml"  # named in the loader's error
    path.write_text(text)
    if "tests" in data and "rule_files" in data:
        from watchd.rules.commands import run_test

        # the rule files a documented test names are the shipped pack's, relative to rules/tests/
        (tmp_path / "tests").mkdir(exist_ok=True)
        for rules in (ROOT / "rules").glob("*.yaml"):
            shutil.copy(rules, tmp_path / rules.name)
        test = tmp_path / "tests" / "example.yaml"
        test.write_text(text)
        out = StringIO()
        assert run_test([test], out) == 0, f"{where}:\n{out.getvalue()}"
        return "rule test"
    if "disable_defaults" in data or any(isinstance(r, dict) for r in data.get("rules") or []):
        from watchd.rules.loader import parse_rule_file_in_full

        parsed = parse_rule_file_in_full(text, where)
        assert parsed.problems == [], f"{where}: {parsed.problems}"
        return "rule file"
    engine_keys, agent_keys = set(EngineConfig.model_fields), set(AgentConfig.model_fields)
    if kind == "engine" or (kind is None and set(data) <= engine_keys):
        load_config(EngineConfig, path)
        return "engine config"
    assert kind == "agent" or set(data) <= agent_keys, f"{where}: neither an engine nor an agent config"
    load_config(AgentConfig, path)
    return "agent config"


def test_every_yaml_example_in_the_docs_loads(tmp_path: Path) -> None:
    seen: dict[str, list[str]] = {}
    for name, line, text in yaml_blocks():
        for kind, part in _parts(text):
            seen.setdefault(_load(kind, part, f"{name}:{line}", tmp_path), []).append(f"{name}:{line}")
    assert any(where.startswith("checks.md:") for where in seen["engine config"])
    for what in NOT_WATCHD.values():  # the list of exceptions does not outlive its examples
        assert what in seen, what
    assert {"engine config", "agent config", "rule file", "rule test"} <= set(seen)


def test_a_broken_example_would_be_caught(tmp_path: Path) -> None:
    from watchd.errors import ConfigError

    with pytest.raises(ConfigError, match=r"checks\.items\.0\.command\.2"):
        _load(None, "checks: {items: [{name: n, type: nccl, command: [x, -b, 8]}]}\n", "x.md:3", tmp_path)
