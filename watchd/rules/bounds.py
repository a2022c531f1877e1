"""The bounds of a template render (docs/rules.md, *Templates*): the size of what a template builds, the work
one render may do, and what is refused at load because it can only break them.

The sandbox keeps templates away from the engine's internals; these bounds keep them from its memory and its
event loop. Every operation that can build a large value from a small one (``*``, ``**``, ``+``, ``%``,
``~``, the size-taking string methods, filters, ``str.format``) is intercepted and checked *before* it
builds; every loop iteration, call, filter, operator and piece of output is a step of a per-render budget,
with a CPU-time deadline behind it. A template over a bound renders ``<template error: ...>`` for that
action, as any other template error.
"""

from __future__ import annotations

import re
import string
import time
from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from contextvars import ContextVar
from functools import wraps
from typing import Any

from jinja2 import nodes
from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import pass_context
from jinja2.visitor import NodeTransformer, NodeVisitor
from markupsafe import Markup

#: The most a template may build: characters of a string (or items of a list, tuple, mapping), the text one
#: value converts to, the width or precision of a format spec, and the rendered text.
MAX_TEMPLATE_OUTPUT = 10_000
#: The most steps one render may take: a loop iteration, a call, a filter, an operator, a piece of output.
MAX_TEMPLATE_STEPS = 10_000
#: The most text one render may write, counting what macros and ``{% set %}`` blocks capture.
MAX_TEMPLATE_WRITTEN = 100_000
#: The largest integer ``*`` or ``**`` may build (bits: about 3,000 decimal digits), the largest exponent.
MAX_TEMPLATE_INT_BITS = 10_000
MAX_TEMPLATE_POWER = 100
#: CPU time one render may take (seconds): what stops a render whose every step is allowed but slow.
MAX_TEMPLATE_CPU_S = 0.005


class TemplateBoundError(Exception):
    """A template went over one of the bounds (at render, or found at load)."""


class _Budget:
    __slots__ = ("deadline", "steps", "tick", "written")

    def __init__(self) -> None:
        self.steps = 0
        self.written = 0
        self.tick = 0  # toward the next look at the clock
        self.deadline = 0.0  # set at the first look: a render too short to look never reads the clock


_BUDGET: ContextVar[_Budget | None] = ContextVar("watchd_template_budget", default=None)


def start_budget() -> Any:
    """A fresh budget for the render about to run; pass the token to :func:`end_budget`."""
    return _BUDGET.set(_Budget())


def end_budget(token: Any) -> None:
    _BUDGET.reset(token)


def step(heavy: bool = False) -> None:
    """One step of the current render (none outside a render: at load, nothing is charged). The CPU clock
    (a system call) is read every 32 light steps (a loop iteration, an output) or 2 heavy ones (a call, a
    filter); the deadline runs from the first reading."""
    b = _BUDGET.get()
    if b is None:
        return
    b.steps += 1
    if b.steps > MAX_TEMPLATE_STEPS:
        raise TemplateBoundError(f"the template took more than {MAX_TEMPLATE_STEPS:,} steps")
    b.tick += 16 if heavy else 1
    if b.tick >= 32:
        b.tick = 0
        now = time.thread_time()
        if not b.deadline:
            b.deadline = now + MAX_TEMPLATE_CPU_S
        elif now > b.deadline:
            raise TemplateBoundError(
                f"the template ran past its {MAX_TEMPLATE_CPU_S * 1000:g} ms of CPU time"
            )


def _too_big(what: str, size: int) -> TemplateBoundError:
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
        raise _too_big(what, size)
    return value


def check_size(value: Any) -> Any:
    """A value a template built: at most MAX_TEMPLATE_OUTPUT characters or items."""
    sized = isinstance(value, str | bytes | bytearray | list | tuple | dict | set | frozenset)
    if sized and len(value) > MAX_TEMPLATE_OUTPUT:
        raise _too_big("a value", len(value))
    return value


def _width(value: Any, what: str) -> None:
    if isinstance(value, int) and value > MAX_TEMPLATE_OUTPUT:
        raise _too_big(what, value)


def _sized_total(items: list[Any]) -> int:
    return sum(len(i) if isinstance(i, str | bytes | list | tuple) else 0 for i in items)


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
            raise _too_big("a sum", len(left) + len(right))
        return left + right
    if operator == "%" and isinstance(left, str | bytes):
        check_percent(left, right)
        return check_size(left % right)
    return table[operator](left, right)


_PERCENT = re.compile(rb"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.)", re.S)


def check_percent(fmt: str | bytes, args: Any) -> None:
    """``fmt % args`` stays within the bounds: widths and precisions, and the estimated result."""
    raw = fmt.encode("utf-8", "surrogatepass") if isinstance(fmt, str) else fmt
    values: Iterator[Any] = iter(args if isinstance(args, tuple) else (args,))
    mapping = args if isinstance(args, Mapping) else None
    total = len(fmt)
    for m in _PERCENT.finditer(raw):
        key, width_s, prec_s, conv = m.group(1), m.group(2), m.group(3), m.group(4)
        if conv == b"%":
            continue
        width = next(values, 0) if width_s == b"*" else int(width_s or 0)
        prec = next(values, 0) if prec_s == b"*" else int(prec_s or 0)
        for what, n in (("a width", width), ("a precision", prec)):
            _width(n, what)
        if key is not None and mapping is not None:
            value = mapping.get(key.decode("utf-8", "replace"))
        else:
            value = next(values, None)
        piece = text_size(value) if conv in b"sra" else text_size(value) + 330 + (prec or 6)
        total += max(width if isinstance(width, int) else 0, piece)
    if total > MAX_TEMPLATE_OUTPUT:
        raise _too_big("formatted text", total)


_SPEC_NUMBER = re.compile(r"\d+")


def check_spec(spec: str) -> None:
    """A ``str.format`` spec's width and precision (every number in it) within the bound."""
    for n in _SPEC_NUMBER.findall(spec):
        if len(n) > 6 or int(n) > MAX_TEMPLATE_OUTPUT:
            raise _too_big("a format width or precision", int(n) if len(n) < 20 else 10**19)  # no huge int()


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
            raise _too_big("formatted text", self._written)
        return out


class BoundedFormatter(_BoundedFormatterMixin, SandboxedFormatter):
    pass


class BoundedEscapeFormatter(_BoundedFormatterMixin, SandboxedEscapeFormatter):
    pass


# --- method calls ----------------------------------------------------------------------------------------

_WIDTH_METHODS = frozenset({"ljust", "rjust", "center", "zfill"})


def check_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Before a call: a method that builds from a small argument (a width, a count, a table) stays within
    the bound. Returns the arguments to call with (``join``'s iterable is read once, here)."""
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if isinstance(owner, str | bytes | bytearray):
        if name in _WIDTH_METHODS and args:
            _width(args[0], f"{name}() width")
        elif name == "expandtabs":
            tab = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(tab, int):
                tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
                size = len(owner) + tabs * max(tab, 0)
                if size > MAX_TEMPLATE_OUTPUT:
                    raise _too_big("expandtabs() text", size)
        elif name == "replace" and len(args) >= 2:
            old, new = args[0], args[1]
            if isinstance(old, str | bytes) and isinstance(new, str | bytes):
                n = owner.count(old) if old else len(owner) + 1  # type: ignore[arg-type]
                if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                    n = min(n, args[2])
                size = len(owner) + n * (len(new) - len(old))
                if size > MAX_TEMPLATE_OUTPUT:
                    raise _too_big("replace() text", size)
        elif name == "join" and args:
            items = list(_bounded_iter(args[0]))
            size = _sized_total(items) + len(owner) * max(len(items) - 1, 0)
            if size > MAX_TEMPLATE_OUTPUT:
                raise _too_big("join() text", size)
            return (items, *args[1:])
        elif name == "translate" and args and isinstance(args[0], Mapping):
            longest = max((text_size(v) for v in args[0].values()), default=1)
            if longest * len(owner) > MAX_TEMPLATE_OUTPUT:
                raise _too_big("translate() text", longest * len(owner))
    elif isinstance(owner, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        _width(length, "to_bytes() length")
    return args


def _bounded_iter(items: Iterable[Any]) -> Iterator[Any]:
    for n, item in enumerate(items):
        if n >= MAX_TEMPLATE_OUTPUT:
            raise _too_big("an iterable", n + 1)
        yield item


# --- filters ---------------------------------------------------------------------------------------------

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
        _width(arg(0, "width", 80), "center width")
    elif name == "indent":
        width = arg(0, "width", 4)
        lines = str(value).count("\n") + 1
        per = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        if text_size(value) + lines * per > MAX_TEMPLATE_OUTPUT:
            raise _too_big("indented text", text_size(value) + lines * per)
    elif name == "wordwrap":
        width, wrap = arg(0, "width", 79), arg(3, "wrapstring", None)
        if isinstance(width, int) and isinstance(wrap, str):
            text = str(value)  # bounded above (a text filter)
            breaks = min(len(text), len(text.split()) + len(text) // max(width, 1))
            size = len(text) + breaks * len(wrap)
            if size > MAX_TEMPLATE_OUTPUT:
                raise _too_big("wrapped text", size)
    elif name == "replace":
        return value  # the text is bounded above; the result is checked after
    elif name == "format":
        if isinstance(value, str):
            check_percent(value, kwargs if kwargs else tuple(args))
    elif name in ("batch", "slice"):
        _width(arg(0, "linecount" if name == "batch" else "slices", 1), f"|{name} count")
    elif name in ("join", "sum"):
        items = list(_bounded_iter(value)) if isinstance(value, Iterable) else value
        if isinstance(items, list):
            if name == "join":
                for item in items:
                    check_text(item, "a joined item")
                size = sum(text_size(i) for i in items) + len(str(arg(0, "d", ""))) * len(items)
            else:
                size = _sized_total(items)
            if size > MAX_TEMPLATE_OUTPUT:
                raise _too_big(f"|{name} result", size)
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


@pass_context
def loop_filter(context: Any, iterable: Any) -> Iterator[Any]:
    """What a ``for`` loop iterates: every iteration a step."""
    for item in iterable:
        step()
        yield item


@pass_context
def out_filter(context: Any, value: Any) -> Any:
    """A piece of output (also into a macro or a ``{% set %}`` block): charged by its size."""
    step()
    size = text_size(value)
    if size > MAX_TEMPLATE_OUTPUT:
        raise _too_big("a piece of output", size)
    b = _BUDGET.get()
    if b is not None:
        b.written += size
        if b.written > MAX_TEMPLATE_WRITTEN:
            raise TemplateBoundError(f"the template wrote more than {MAX_TEMPLATE_WRITTEN:,} characters")
    return value


@pass_context
def concat_filter(context: Any, parts: list[Any]) -> str:
    """``a ~ b``: bounded before it is joined."""
    step()
    size = sum(text_size(p) for p in parts)
    if size > MAX_TEMPLATE_OUTPUT:
        raise _too_big("a ~ concatenation", size)
    return "".join(map(str, parts))


INTERNAL_FILTERS = {"_watchd_loop": loop_filter, "_watchd_out": out_filter, "_watchd_concat": concat_filter}


class Instrument(NodeTransformer):
    """Rewrites a parsed template so that every loop, ``~`` and piece of output passes through the filters
    above (before it is compiled)."""

    def __init__(self) -> None:
        self.depth = 0  # inside a loop, macro or call block: constant text is written repeatedly

    def _filter(self, node: nodes.Expr, name: str) -> nodes.Filter:
        new = nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)
        new.environment = node.environment
        return new

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node.iter = self._filter(self.visit(node.iter), "_watchd_loop")
        self.depth += 1
        for field in ("body", "else_"):
            setattr(node, field, [self.visit(n) for n in getattr(node, field)])
        if node.test is not None:
            node.test = self.visit(node.test)
        self.depth -= 1
        return node

    def _repeated(self, node: nodes.Node) -> nodes.Node:
        self.depth += 1
        try:
            return self.generic_visit(node)
        finally:
            self.depth -= 1

    visit_Macro = visit_CallBlock = _repeated

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        items = nodes.List(list(node.nodes), lineno=node.lineno)
        items.environment = node.environment
        return self._filter(items, "_watchd_concat")

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        out: list[nodes.Expr] = []
        for child in node.nodes:
            if isinstance(child, nodes.TemplateData):
                if self.depth:
                    const = nodes.Const(child.data, lineno=child.lineno)
                    const.environment = child.environment
                    out.append(self._filter(const, "_watchd_out"))
                else:
                    out.append(child)
            else:
                out.append(self._filter(self.visit(child), "_watchd_out"))
        node.nodes = out
        return node


# --- refused at load -------------------------------------------------------------------------------------


class _Refused(Exception):
    pass


class StaticCheck(NodeVisitor):
    """What a template must break, found without rendering it: a literal width, precision, count or power
    over the bounds, text that doubles past them through ``{% set %}``, nested loops over literal
    sequences whose iterations multiply past the step budget."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.loops = 1

    def check(self, node: nodes.Node) -> str | None:
        try:
            self.visit(node)
        except _Refused as exc:
            return str(exc)
        return None

    # -- values known at load
    def const_int(self, node: nodes.Node) -> int | None:
        if isinstance(node, nodes.Const) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, nodes.Neg):
            v = self.const_int(node.node)
            return None if v is None else -v
        if isinstance(node, nodes.Pow | nodes.Mul | nodes.Add):
            a, b = self.const_int(node.left), self.const_int(node.right)
            if a is None or b is None:
                return None
            if isinstance(node, nodes.Pow):
                if abs(b) > MAX_TEMPLATE_POWER:
                    raise _Refused(f"power {b} is over the bound of {MAX_TEMPLATE_POWER}")
                if b < 0:
                    return None
                if abs(a) > 1 and a.bit_length() * b > MAX_TEMPLATE_INT_BITS:
                    raise _Refused(f"{a} ** {b} is over the bound of {MAX_TEMPLATE_INT_BITS:,} bits")
                return int(a**b)
            if isinstance(node, nodes.Mul):
                if a.bit_length() + b.bit_length() > MAX_TEMPLATE_INT_BITS:
                    raise _Refused(f"a product is over the bound of {MAX_TEMPLATE_INT_BITS:,} bits")
                return a * b
            return a + b
        return None

    def size(self, node: nodes.Node) -> int | None:
        """Characters or items of the value ``node`` builds, when known at load."""
        if isinstance(node, nodes.Const):
            v = node.value
            return len(v) if isinstance(v, str | list | tuple) else None
        if isinstance(node, nodes.TemplateData):
            return len(node.data)
        if isinstance(node, nodes.List | nodes.Tuple):
            return len(node.items)
        if isinstance(node, nodes.Name):
            return self.sizes.get(node.name)
        if isinstance(node, nodes.Concat):
            parts = [self._text_len(n) for n in node.nodes]
            return None if None in parts else sum(p for p in parts if p is not None)
        if isinstance(node, nodes.Add):
            a, b = self.size(node.left), self.size(node.right)
            return None if a is None or b is None else a + b
        if isinstance(node, nodes.Mul):
            for seq, count in ((node.left, node.right), (node.right, node.left)):
                n, k = self.size(seq), self.const_int(count)
                if n is not None and k is not None and not isinstance(seq, nodes.Const | nodes.Name):
                    return n * k
                if (
                    isinstance(seq, nodes.Const)
                    and isinstance(seq.value, str | list | tuple)
                    and k is not None
                ):
                    return len(seq.value) * k
            return None
        if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr) and node.args:
            width = self.const_int(node.args[0]) if node.node.attr in _WIDTH_METHODS else None
            if width is not None:
                return max(width, self.size(node.node.node) or 0)
        if isinstance(node, nodes.Filter) and node.name in (
            "list",
            "string",
            "reverse",
            "sort",
            "e",
            "escape",
        ):
            return self.size(node.node) if node.node is not None else None
        return None

    def _text_len(self, node: nodes.Node) -> int | None:
        """Characters of ``node`` as text (``~`` converts each side): a literal number's too."""
        n = self.size(node)
        if n is None and isinstance(node, nodes.Const) and isinstance(node.value, int | float | bool):
            n = (
                len(str(node.value))
                if not isinstance(node.value, int) or node.value.bit_length() < 1000
                else None
            )
        return n

    def _over(self, node: nodes.Node, what: str) -> None:
        n = self.size(node)
        if n is not None and n > MAX_TEMPLATE_OUTPUT:
            raise _Refused(
                f"{what} of {n:,} characters or items is over the bound of {MAX_TEMPLATE_OUTPUT:,}"
            )

    def _literal_width(self, node: nodes.Node, what: str) -> None:
        n = self.const_int(node)
        if n is not None and n > MAX_TEMPLATE_OUTPUT:
            raise _Refused(f"{what} {n:,} is over the bound of {MAX_TEMPLATE_OUTPUT:,}")

    # -- visitors
    def visit_Call(self, node: nodes.Call) -> None:
        self.generic_visit(node)
        if not isinstance(node.node, nodes.Getattr):
            return
        attr, owner = node.node.attr, node.node.node
        if attr in _WIDTH_METHODS | {"expandtabs", "to_bytes"} and node.args:
            self._literal_width(node.args[0], f"{attr}() width")
        if (
            attr in ("format", "format_map")
            and isinstance(owner, nodes.Const)
            and isinstance(owner.value, str)
        ):
            try:
                for _text, _field, spec, _conv in string.Formatter().parse(owner.value):
                    check_spec(spec or "")
            except TemplateBoundError as exc:
                raise _Refused(str(exc)) from None
            except ValueError:
                return

    def visit_Filter(self, node: nodes.Filter) -> None:
        self.generic_visit(node)
        if node.name in ("center", "indent", "batch", "slice") and node.args:
            self._literal_width(node.args[0], f"|{node.name} width")
        if node.name == "format" and isinstance(node.node, nodes.Const) and isinstance(node.node.value, str):
            self._literal_percent(node.node.value)

    def _literal_percent(self, fmt: str) -> None:
        for m in _PERCENT.finditer(fmt.encode("utf-8", "surrogatepass")):
            for n in (m.group(2), m.group(3)):
                if n and n != b"*" and (len(n) > 6 or int(n) > MAX_TEMPLATE_OUTPUT):
                    shown = f"{int(n):,}" if len(n) < 20 else f"of {len(n):,} digits"
                    raise _Refused(
                        f"a format width or precision {shown} is over the bound of {MAX_TEMPLATE_OUTPUT:,}"
                    )

    def visit_Mod(self, node: nodes.Mod) -> None:
        self.generic_visit(node)
        if isinstance(node.left, nodes.Const) and isinstance(node.left.value, str):
            self._literal_percent(node.left.value)

    def visit_Pow(self, node: nodes.Pow) -> None:
        self.generic_visit(node)
        self.const_int(node)
        exponent = self.const_int(node.right)
        if exponent is not None and abs(exponent) > MAX_TEMPLATE_POWER:
            raise _Refused(f"power {exponent} is over the bound of {MAX_TEMPLATE_POWER}")

    def visit_Mul(self, node: nodes.Mul) -> None:
        self.generic_visit(node)
        self.const_int(node)
        self._over(node, "a product")

    def visit_Concat(self, node: nodes.Concat) -> None:
        self.generic_visit(node)
        self._over(node, "a ~ concatenation")

    def visit_Assign(self, node: nodes.Assign) -> None:
        self.generic_visit(node)
        n = self.size(node.node)
        if isinstance(node.target, nodes.Name):
            if n is None:
                self.sizes.pop(node.target.name, None)
            else:
                self.sizes[node.target.name] = n
        self._over(node.node, "a {% set %} value")

    def visit_Output(self, node: nodes.Output) -> None:
        self.generic_visit(node)
        for child in node.nodes:
            self._over(child, "output")

    def visit_For(self, node: nodes.For) -> None:
        self.visit(node.iter)
        n = self.size(node.iter)
        outer = self.loops
        self.loops = outer * (n if n is not None else 1)
        if self.loops > MAX_TEMPLATE_STEPS:
            raise _Refused(
                f"loops of {self.loops:,} iterations are over the bound of {MAX_TEMPLATE_STEPS:,} steps"
            )
        for child in (*node.body, *node.else_):
            self.visit(child)
        if node.test is not None:
            self.visit(node.test)
        self.loops = outer


def is_markup(value: Any) -> bool:
    return isinstance(value, Markup)
