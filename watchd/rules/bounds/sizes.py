"""How large a value a template built is, or how long its text would be, measured without building it; and
the checks that refuse one over the bound."""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, KeysView, ValuesView
from typing import Any

from watchd.rules.bounds.budget import MAX_TEMPLATE_OUTPUT, TemplateBoundError


def too_big(what: str, size: int) -> TemplateBoundError:
    return TemplateBoundError(f"{what} of {size:,} is over the bound of {MAX_TEMPLATE_OUTPUT:,}")


_CONTAINERS = (list, tuple, set, frozenset, dict, KeysView, ValuesView, ItemsView)


def text_size(value: Any) -> int:
    """About how many characters ``str(value)`` makes (an upper estimate; a container's items are walked
    only until the bound is passed), without making them."""
    if isinstance(value, str):
        return len(value)
    if value is None or isinstance(value, bool | float):
        return 24
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, bytes | bytearray):
        return 4 * len(value) + 3
    if not isinstance(value, _CONTAINERS):
        return len(str(value))  # Undefined, a macro, a loop: short
    total = 0
    todo: list[Any] = [value]
    while todo and total <= MAX_TEMPLATE_OUTPUT:
        item = todo.pop()
        if isinstance(item, dict):
            total += 2
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, _CONTAINERS):
            total += 2
            todo.extend(item)
        elif isinstance(item, str):
            total += (len(repr(item)) if len(item) <= MAX_TEMPLATE_OUTPUT else len(item)) + 2
        else:
            total += text_size(item) + 2
    return total


def check_text(value: Any, what: str = "text") -> Any:
    size = text_size(value)
    if size > MAX_TEMPLATE_OUTPUT:
        raise too_big(what, size)
    return value


def check_size(value: Any) -> Any:
    """A value a template built: at most MAX_TEMPLATE_OUTPUT characters or items."""
    sized = isinstance(value, str | bytes | bytearray | list | tuple | dict | set | frozenset)
    if sized and len(value) > MAX_TEMPLATE_OUTPUT:
        raise too_big("a value", len(value))
    return value


def check_width(value: Any, what: str) -> None:
    if isinstance(value, int) and value > MAX_TEMPLATE_OUTPUT:
        raise too_big(what, value)


def sized_total(items: list[Any]) -> int:
    return sum(len(i) if isinstance(i, str | bytes | list | tuple) else 0 for i in items)


def bounded_iter(items: Iterable[Any]) -> Iterator[Any]:
    for n, item in enumerate(items):
        if n >= MAX_TEMPLATE_OUTPUT:
            raise too_big("an iterable", n + 1)
        yield item
