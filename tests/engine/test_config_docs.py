"""The documentation cannot drift from the loader: every YAML example in the docs loads through the real
loader it is written for (engine or agent config, rule file, rule test file), and docs/configuration.md names
every key the strict config loader accepts, and no other, each with the default the models really have."""

from __future__ import annotations

import re
import shutil
import textwrap
import types
import typing
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

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


def config_keys(model: type[BaseModel], prefix: str = "") -> dict[str, bool]:
    """Every key the strict loader accepts, as a dotted path (``[]``: an element of a list), -> whether it
    is a leaf (a value, not a section)."""
    out: dict[str, bool] = {}
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        sections = list(_models(field.annotation))
        out[key] = not sections
        for suffix, section in sections:
            out.update(config_keys(section, f"{key}{suffix}."))
    return out


def _models(annotation: Any) -> Iterator[tuple[str, type[BaseModel]]]:
    """The models a field's values are, with ``[]`` for a list's elements (a mapping's values are not
    keys: ``detectors.partitions.<name>`` is documented as a whole)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield "", annotation
    elif origin is typing.Annotated:
        yield from _models(args[0])
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from _models(arg)
    elif origin in (list, tuple, set, frozenset):
        for arg in args:
            yield from ((f"[]{suffix}", m) for suffix, m in _models(arg))


def documented_keys(section: str) -> set[str]:
    """The keys the tables of a section of docs/configuration.md name in their first column: a dotted key
    is whole; a plain name after it in the same cell is its sibling (`state.postgres.dsn` / `dsn_env`)."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    keys: set[str] = set()
    for line in body.splitlines():
        if not line.startswith("| `"):
            continue
        parent = ""
        for i, key in enumerate(re.findall(r"`([^`]+)`", line.split(" | ", 1)[0])):
            if "." in key or i == 0:
                parent = key.rpartition(".")[0]
                keys.add(key)
            else:
                keys.add(f"{parent}.{key}" if parent else key)
    return keys


@pytest.mark.parametrize(("section", "model"), [("Engine", EngineConfig), ("Agent", AgentConfig)])
def test_configuration_md_names_every_key_and_no_other(section: str, model: type[BaseModel]) -> None:
    accepted = config_keys(model)
    documented = documented_keys(section)
    missing = [key for key, leaf in accepted.items() if leaf and key not in documented]
    where = f"docs/configuration.md, {section}"
    assert missing == [], f"{where}: keys the loader accepts but the doc leaves out: {missing}"
    assert sorted(documented - set(accepted)) == [], f"{where}: keys no loader accepts"


def documented_defaults(section: str) -> dict[str, str]:
    """The defaults the tables of a section of docs/configuration.md give in their second column, by key,
    where that column is machine-readable: one backticked YAML value per key of the row (`0.2`, `30`), none
    a placeholder (`<hostname>-<pid>`). Prose (``none (the agent's group)``) is left to the reader."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, str] = {}
    for line in body.splitlines():
        if not line.startswith("| `"):
            continue
        names, cell = (c.strip() for c in line.split(" | ")[:2])
        keys, parent = [], ""
        for i, key in enumerate(re.findall(r"`([^`]+)`", names)):
            if "." in key or i == 0:
                parent = key.rpartition(".")[0]
                keys.append(key)
            else:
                keys.append(f"{parent}.{key}" if parent else key)
        values = re.findall(r"`([^`]*)`", cell)
        if not re.fullmatch(r"`[^`]*`(, `[^`]*`)*", cell) or len(values) != len(keys):
            continue
        out.update((key, value) for key, value in zip(keys, values, strict=True) if "<" not in value)
    return out


def model_default(model: type[BaseModel], key: str) -> tuple[Any, Any] | None:
    """(the field's type, its default) for a dotted key, the default read from the defaults of the sections
    above it (a section's default may set it: ``heartbeat.http`` is ``HttpConfig(max_connections=256)``);
    None for a required key."""
    cls: type[BaseModel] = model
    instance: BaseModel | None = model()
    parts = key.split(".")
    for depth, part in enumerate(parts):
        name = part.removesuffix("[]")
        field = cls.model_fields[name]
        if instance is not None:
            value = getattr(instance, name)
        elif field.is_required():
            value = None
        else:
            value = field.get_default(call_default_factory=True)
        if depth == len(parts) - 1:
            if instance is None and field.is_required():
                return None
            return field.rebuild_annotation(), value
        element = part != name
        cls = next(m for s, m in _models(field.annotation) if s == ("[]" if element else ""))
        instance = value if not element and isinstance(value, BaseModel) else None
    raise AssertionError(key)


@pytest.mark.parametrize(("section", "model"), [("Engine", EngineConfig), ("Agent", AgentConfig)])
def test_configuration_md_gives_every_key_its_real_default(section: str, model: type[BaseModel]) -> None:
    documented = documented_defaults(section)
    assert len(documented) > 50, "the default column is no longer read: check documented_defaults"
    wrong = []
    for key, raw in sorted(documented.items()):
        found = model_default(model, key)
        if found is None:
            continue  # a required key has no default to document
        annotation, default = found
        try:
            said = TypeAdapter(annotation).validate_python(yaml.safe_load(raw))
        except (ValidationError, yaml.YAMLError) as exc:
            wrong.append(f"{key}: `{raw}` is not a value of the key ({str(exc).splitlines()[0]})")
            continue
        if said != default:
            wrong.append(f"{key}: documented `{raw}`, the default is {default!r}")
    assert wrong == [], f"docs/configuration.md, {section}:\n" + "\n".join(wrong)
