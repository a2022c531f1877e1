"""Reading the YAML people write (daemon configs, rule files, rule tests) strictly, and saying where a problem
is: a key given twice in one mapping is refused (YAML's own loaders keep the last one silently), every
position is a 1-based line and column (``file:12:5``), and an unknown key gets a "did you mean" from the
keys the model knows."""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

__all__ = ["DuplicateKeyError", "YamlPath", "YamlPositions", "keys_at", "safe_load", "suggestion"]

YamlPath = tuple[str | int, ...]

#: Model field names that differ from their YAML key (``for`` is a Python keyword).
_ALIASES = {"for_": "for"}
_MERGE = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A key given twice in one mapping; ``problem_mark`` is the second, the message names the first."""


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE or not isinstance(key_node, yaml.ScalarNode):
                continue  # `<<: *defaults` may be overridden by the keys beside it: YAML's merge
            key = self.construct_object(key_node)
            try:
                first = seen.get(key)
            except TypeError:
                continue
            if first is not None:
                raise DuplicateKeyError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {first.line + 1}, column {first.column + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def safe_load(text: str) -> Any:
    """``yaml.safe_load``, but a key given twice in one mapping raises :class:`DuplicateKeyError`."""
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: plain data only


class YamlPositions:
    """Where each key path is in one YAML document."""

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
                    if k.value == wanted or (isinstance(wanted, int) and k.value == str(wanted)):
                        nxt = k if (key and i == len(path) - 1) else v
                        break
            elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
                nxt = node.value[step]
            if nxt is None:
                break
            node = nxt
        mark = node.start_mark
        return mark.line + 1, mark.column + 1


def suggestion(word: str, known: Sequence[str] | None) -> str:
    """`` (did you mean 'port'?)`` when ``known`` has a key close to ``word``, else nothing."""
    if not known:
        return ""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation may hold (through ``Optional``, unions and ``Annotated``)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _models(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in get_args(annotation) for m in _models(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _step(annotation: Any, step: str | int) -> Any:
    """The annotation one step down a validation error's location, or None where it cannot be followed."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _step(get_args(annotation)[0], step)
    if origin is Union or origin is types.UnionType:
        for arg in get_args(annotation):
            if (found := _step(arg, step)) is not None:
                return found
        # a discriminated union puts the tag in the location: stay on the union, whose member comes next
        return annotation if isinstance(step, str) and _models(annotation) else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, field in annotation.model_fields.items():
            if step in (name, field.alias, _ALIASES.get(name)):
                return field.annotation
        return None
    if isinstance(step, int) and origin in (list, tuple, set, frozenset, Sequence):
        return get_args(annotation)[0] if get_args(annotation) else None
    if isinstance(step, str) and origin in (dict, Mapping):
        args = get_args(annotation)
        return args[1] if len(args) == 2 else None
    return None


def keys_at(model: type[BaseModel], loc: Sequence[str | int]) -> list[str] | None:
    """The keys a mapping at ``loc`` (a pydantic location, tags included) may have in ``model``."""
    annotation: Any = model
    for step in loc:
        annotation = _step(annotation, step)
        if annotation is None:
            return None
    keys = [
        _ALIASES.get(name, field.alias or name)
        for m in _models(annotation)
        for name, field in m.model_fields.items()
    ]
    return keys or None
