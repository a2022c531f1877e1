"""Where a key path is in a YAML document (1-based line and column), for messages like file:12:5."""

from __future__ import annotations

from typing import Any

import yaml

YamlPath = tuple[str | int, ...]

#: Model field names that differ from their YAML key (``for`` is a Python keyword).
_ALIASES = {"for_": "for"}


class YamlPositions:
    def __init__(self, text: str) -> None:
        try:
            self.root: yaml.Node | None = yaml.compose(text)
        except yaml.YAMLError:
            self.root = None

    def of(self, path: YamlPath, key: bool = False) -> tuple[int, int]:
        """The position of the value at ``path`` (of its key with ``key``); the deepest one found."""
        node = self.root
        if node is None:
            return 1, 1
        for i, step in enumerate(path):
            nxt: yaml.Node | None = None
            if isinstance(node, yaml.MappingNode):
                wanted = _ALIASES.get(step, step) if isinstance(step, str) else step
                for k, v in node.value:
                    if k.value == wanted:
                        nxt = k if (key and i == len(path) - 1) else v
                        break
            elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
                nxt = node.value[step]
            if nxt is None:
                break
            node = nxt
        mark = node.start_mark
        return mark.line + 1, mark.column + 1


def load_with_position(text: str) -> tuple[Any, tuple[int, int, str] | None]:
    """The parsed document, or None and (line, column, message) of the YAML error."""
    try:
        return yaml.safe_load(text), None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        return None, (line, col, f"invalid YAML: {getattr(exc, 'problem', None) or exc}")
