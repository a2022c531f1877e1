"""Jinja's filters, bounded: each a step, its arguments checked before it runs and its result after."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any

from watchd.rules.bounds.budget import MAX_TEMPLATE_OUTPUT, step
from watchd.rules.bounds.operations import check_percent
from watchd.rules.bounds.sizes import (
    bounded_iter,
    check_size,
    check_text,
    check_width,
    sized_total,
    text_size,
    too_big,
)

#: Filters that convert their value to text first.
_TEXT_FILTERS = frozenset(
    {
        "capitalize",
        "center",
        "e",
        "escape",
        "forceescape",
        "indent",
        "lower",
        "upper",
        "title",
        "trim",
        "striptags",
        "string",
        "safe",
        "truncate",
        "urlize",
        "wordcount",
        "wordwrap",
        "replace",
        "reverse",
        "urlencode",
        "tojson",
        "pprint",
        "xmlattr",
    }
)


def _check_filter(name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Before a filter runs; returns the value to run it on (an iterable ``join``/``sum`` read, bounded)."""

    def arg(i: int, key: str, default: Any) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name in _TEXT_FILTERS:
        check_text(value, f"the value of |{name}")
    if name == "center":
        check_width(arg(0, "width", 80), "center width")
    elif name == "indent":
        width = arg(0, "width", 4)
        lines = str(value).count("\n") + 1
        per = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        if text_size(value) + lines * per > MAX_TEMPLATE_OUTPUT:
            raise too_big("indented text", text_size(value) + lines * per)
    elif name == "wordwrap":
        width, wrap = arg(0, "width", 79), arg(3, "wrapstring", None)
        if isinstance(width, int) and isinstance(wrap, str):
            text = str(value)  # bounded above (a text filter)
            breaks = min(len(text), len(text.split()) + len(text) // max(width, 1))
            size = len(text) + breaks * len(wrap)
            if size > MAX_TEMPLATE_OUTPUT:
                raise too_big("wrapped text", size)
    elif name == "replace":
        return value  # the text is bounded above; the result is checked after
    elif name == "format":
        if isinstance(value, str):
            check_percent(value, kwargs if kwargs else tuple(args))
    elif name in ("batch", "slice"):
        check_width(arg(0, "linecount" if name == "batch" else "slices", 1), f"|{name} count")
    elif name in ("join", "sum"):
        items = list(bounded_iter(value)) if isinstance(value, Iterable) else value
        if isinstance(items, list):
            if name == "join":
                for item in items:
                    check_text(item, "a joined item")
                size = sum(text_size(i) for i in items) + len(str(arg(0, "d", ""))) * len(items)
            else:
                size = sized_total(items)
            if size > MAX_TEMPLATE_OUTPUT:
                raise too_big(f"|{name} result", size)
        return items
    return value


def bound_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (a Jinja filter) with a step charged, its arguments checked before and its result after."""
    passes = getattr(func, "jinja_pass_arg", None) is not None

    @wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        step(heavy=True)
        lead, rest = (args[:1], args[1:]) if passes else ((), args)
        if rest:
            value = _check_filter(name, rest[0], rest[1:], kwargs)
            args = (*lead, value, *rest[1:])
        return check_size(func(*args, **kwargs))

    return bounded
