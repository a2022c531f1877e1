"""Where a key path is in a YAML document (1-based line and column), for messages like file:12:5; the
loading itself is :mod:`watchd.yamlfile`'s (a key given twice is refused)."""

from __future__ import annotations

from typing import Any

import yaml

from watchd.yamlfile import DuplicateKeyError, YamlPath, YamlPositions, safe_load

__all__ = ["YamlPath", "YamlPositions", "load_with_position"]


def load_with_position(text: str) -> tuple[Any, tuple[int, int, str] | None]:
    """The parsed document, or None and (line, column, message) of the YAML error."""
    try:
        return safe_load(text), None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        problem = getattr(exc, "problem", None) or exc
        return None, (
            line,
            col,
            f"{problem}" if isinstance(exc, DuplicateKeyError) else f"invalid YAML: {problem}",
        )
