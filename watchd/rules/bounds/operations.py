"""The operations that can build a large value from a small one, checked before they build: the operators
(``*``, ``**``, ``+``, ``%``), ``str.format`` through a bounded formatter, and the size-taking methods
(``ljust``, ``replace``, ``join``, ...)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter
from markupsafe import Markup

from watchd.rules.bounds.budget import (
    MAX_TEMPLATE_INT_BITS,
    MAX_TEMPLATE_OUTPUT,
    MAX_TEMPLATE_POWER,
    TemplateBoundError,
    step,
)
from watchd.rules.bounds.sizes import (
    bounded_iter,
    check_size,
    check_text,
    check_width,
    sized_total,
    text_size,
    too_big,
)

# --- operators ------------------------------------------------------------------------------------------


def _check_int_bits(bits: int) -> None:
    if bits > MAX_TEMPLATE_INT_BITS:
        raise TemplateBoundError(
            f"an integer of about {bits:,} bits is over the bound of {MAX_TEMPLATE_INT_BITS:,}"
        )


def binop(operator: str, left: Any, right: Any, table: Mapping[str, Callable[[Any, Any], Any]]) -> Any:
    step()
    if operator == "**":
        if isinstance(right, int | float) and abs(right) > MAX_TEMPLATE_POWER:
            raise TemplateBoundError(f"power {right!r} is too large for a template")
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            _check_int_bits(left.bit_length() * right)
        return left**right
    if operator == "*":
        for size, count in ((left, right), (right, left)):
            sized = isinstance(size, str | bytes | list | tuple) and isinstance(count, int)
            if sized and len(size) * count > MAX_TEMPLATE_OUTPUT:
                raise TemplateBoundError(f"a template may build at most {MAX_TEMPLATE_OUTPUT:,} items")
        if isinstance(left, int) and isinstance(right, int):
            _check_int_bits(left.bit_length() + right.bit_length())
        return left * right
    if operator == "+":
        both = isinstance(left, str | bytes | list | tuple) and isinstance(right, str | bytes | list | tuple)
        if both and len(left) + len(right) > MAX_TEMPLATE_OUTPUT:
            raise too_big("a sum", len(left) + len(right))
        return left + right
    if operator == "%" and isinstance(left, str | bytes):
        check_percent(left, right)
        return check_size(left % right)
    return table[operator](left, right)


PERCENT = re.compile(rb"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.)", re.S)


def check_percent(fmt: str | bytes, args: Any) -> None:
    """``fmt % args`` stays within the bounds: widths and precisions, and the estimated result."""
    raw = fmt.encode("utf-8", "surrogatepass") if isinstance(fmt, str) else fmt
    values: Iterator[Any] = iter(args if isinstance(args, tuple) else (args,))
    mapping = args if isinstance(args, Mapping) else None
    total = len(fmt)
    for m in PERCENT.finditer(raw):
        key, width_s, prec_s, conv = m.group(1), m.group(2), m.group(3), m.group(4)
        if conv == b"%":
            continue
        width = next(values, 0) if width_s == b"*" else int(width_s or 0)
        prec = next(values, 0) if prec_s == b"*" else int(prec_s or 0)
        for what, n in (("a width", width), ("a precision", prec)):
            check_width(n, what)
        if key is not None and mapping is not None:
            value = mapping.get(key.decode("utf-8", "replace"))
        else:
            value = next(values, None)
        piece = text_size(value) if conv in b"sra" else text_size(value) + 330 + (prec or 6)
        total += max(width if isinstance(width, int) else 0, piece)
    if total > MAX_TEMPLATE_OUTPUT:
        raise too_big("formatted text", total)


_SPEC_NUMBER = re.compile(r"\d+")


def check_spec(spec: str) -> None:
    """A ``str.format`` spec's width and precision (every number in it) within the bound."""
    for n in _SPEC_NUMBER.findall(spec):
        if len(n) > 6 or int(n) > MAX_TEMPLATE_OUTPUT:
            raise too_big("a format width or precision", int(n) if len(n) < 20 else 10**19)  # no huge int()


class _BoundedFormatterMixin:
    _written = 0

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        check_text(value, "a formatted value")
        return super().convert_field(value, conversion)  # type: ignore[misc]

    def format_field(self, value: Any, format_spec: str) -> Any:
        step()
        check_spec(format_spec)
        check_text(value, "a formatted value")
        out = super().format_field(value, format_spec)  # type: ignore[misc]
        self._written += len(out)
        if self._written > MAX_TEMPLATE_OUTPUT:
            raise too_big("formatted text", self._written)
        return out


class BoundedFormatter(_BoundedFormatterMixin, SandboxedFormatter):
    pass


class BoundedEscapeFormatter(_BoundedFormatterMixin, SandboxedEscapeFormatter):
    pass


# --- method calls ----------------------------------------------------------------------------------------

WIDTH_METHODS = frozenset({"ljust", "rjust", "center", "zfill"})


def check_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Before a call: a method that builds from a small argument (a width, a count, a table) stays within
    the bound. Returns the arguments to call with (``join``'s iterable is read once, here)."""
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if isinstance(owner, str | bytes | bytearray):
        if name in WIDTH_METHODS and args:
            check_width(args[0], f"{name}() width")
        elif name == "expandtabs":
            tab = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(tab, int):
                tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
                size = len(owner) + tabs * max(tab, 0)
                if size > MAX_TEMPLATE_OUTPUT:
                    raise too_big("expandtabs() text", size)
        elif name == "replace" and len(args) >= 2:
            old, new = args[0], args[1]
            if isinstance(old, str | bytes) and isinstance(new, str | bytes):
                n = owner.count(old) if old else len(owner) + 1  # type: ignore[arg-type]
                if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                    n = min(n, args[2])
                size = len(owner) + n * (len(new) - len(old))
                if size > MAX_TEMPLATE_OUTPUT:
                    raise too_big("replace() text", size)
        elif name == "join" and args:
            items = list(bounded_iter(args[0]))
            size = sized_total(items) + len(owner) * max(len(items) - 1, 0)
            if size > MAX_TEMPLATE_OUTPUT:
                raise too_big("join() text", size)
            return (items, *args[1:])
        elif name == "translate" and args and isinstance(args[0], Mapping):
            longest = max((text_size(v) for v in args[0].values()), default=1)
            if longest * len(owner) > MAX_TEMPLATE_OUTPUT:
                raise too_big("translate() text", longest * len(owner))
    elif isinstance(owner, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        check_width(length, "to_bytes() length")
    return args


def is_markup(value: Any) -> bool:
    return isinstance(value, Markup)
