"""Rule strings are Jinja2 templates, rendered in a sandbox: no attribute access to internals, no code.

The context holds the event's fields at the top level (``{{ xid }}``, ``{{ pci_bus_id }}``), and ``event``
(the same fields), ``node``, ``job``, ``rule``, ``count`` and ``group``. A template naming anything else is
rejected when the rules are loaded.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Mapping
from functools import update_wrapper
from typing import Any

from jinja2 import TemplateSyntaxError, Undefined, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from watchd.model.events import TOP_LEVEL_FIELDS
from watchd.model.gpu import GPU_IDENTITY_FIELDS
from watchd.model.registry import KINDS, fields_of
from watchd.rules.bounds.budget import MAX_TEMPLATE_OUTPUT, end_budget, start_budget, step
from watchd.rules.bounds.filters import bound_filter
from watchd.rules.bounds.instrument import INTERNAL_FILTERS, Instrument
from watchd.rules.bounds.operations import (
    BoundedEscapeFormatter,
    BoundedFormatter,
    binop,
    check_call,
    is_markup,
)
from watchd.rules.bounds.sizes import check_size
from watchd.rules.bounds.static_check import StaticCheck
from watchd.rules.compiled.codegen import Namespace
from watchd.shortlist import shortlist
from watchd.xid.pci import short_pci

#: Fields any event may carry, and what every template may name besides them.
COMMON_FIELDS = TOP_LEVEL_FIELDS
CONTEXT_NAMES = frozenset({"event", "node", "job", "rule", "count", "group", "severity"})
#: Fields of the event kinds watchd produces, from their classes (a template naming another field is an
#: error).
KIND_FIELDS: dict[str, frozenset[str]] = {kind: fields_of(kind) for kind in KINDS}
#: Fields any rule may name whatever its kinds: how GPU kinds name their GPU, the job the engine attaches,
#: and a ``gpu_health`` measurement.
GPU_FIELDS = frozenset({*GPU_IDENTITY_FIELDS, "job", "value", "threshold", "evidence"})


class _Undefined(Undefined):
    """A field the event does not carry renders as ``?``."""

    def __str__(self) -> str:
        return "?"


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, plus the bounds of watchd/rules/bounds/: the operators, calls, filters and
    ``str.format`` that can build huge values from small ones are checked before they build, and each is a
    step of the render's budget."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        return binop(operator, left, right, self.binop_table)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        step(heavy=True)
        args = check_call(__obj, args, kwargs)
        return check_size(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """Jinja's sandboxed ``str.format``/``format_map``, through a formatter that bounds widths,
        precisions, converted values and the text it builds."""
        if not isinstance(value, types.MethodType | types.BuiltinMethodType) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        f_self: Any = value.__self__
        if not isinstance(f_self, str):
            return None
        str_type: type[str] = type(f_self)
        is_format_map = value.__name__ == "format_map"

        def wrapper(*args: Any, **kwargs: Any) -> str:
            formatter: BoundedFormatter | BoundedEscapeFormatter
            if is_markup(f_self):
                formatter = BoundedEscapeFormatter(self, escape=f_self.escape)  # type: ignore[attr-defined]
            else:
                formatter = BoundedFormatter(self)
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs = args[0]
                args = ()
            return str_type(formatter.vformat(f_self, args, kwargs))

        return update_wrapper(wrapper, value)


_ENV = _BoundedEnvironment(undefined=_Undefined, autoescape=False, keep_trailing_newline=False)
_ENV.globals.clear()  # no range(), lipsum(), cycler(): a template formats fields, nothing more
_ENV.filters = {name: bound_filter(name, f) for name, f in _ENV.filters.items()}
_ENV.filters.update(INTERNAL_FILTERS)
#: watchd's own: a GPU's PCI address as short as tells it apart (``0000:3b:00.0`` -> ``3b:00``), for the
#: 20 characters of a drain reason that ``sinfo -R`` shows
_ENV.filters["short_pci"] = bound_filter("short_pci", short_pci)
_ENV.filters["shortlist"] = bound_filter("shortlist", shortlist)


class TemplateError(ValueError):
    pass


_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?\s*\}\}")
_MISSING = object()


def _simple_parts(source: str) -> list[str | tuple[str, str | None]] | None:
    """Text with only ``{{ name }}`` / ``{{ name.field }}`` placeholders, split into literal text and
    lookups; None when the template needs Jinja (filters, expressions, statements)."""
    parts: list[str | tuple[str, str | None]] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(source):
        parts.append(source[pos : m.start()])
        parts.append((m.group(1), m.group(2)))
        pos = m.end()
    parts.append(source[pos:])
    literal = "".join(p for p in parts if isinstance(p, str))
    if "{{" in literal or "{%" in literal or "{#" in literal:
        return None
    return [p for p in parts if p != ""]


class Template:
    """Compiled once at load; ``render`` is a pure function of the context. Templates made only of text and
    ``{{ field }}`` placeholders (nearly all of them) are rendered without Jinja, with the same result."""

    __slots__ = ("_compiled", "_parts", "_static", "names", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        try:  # an unknown filter or test is found by the compiler, not the parser: both inside
            tree = _ENV.parse(source)
            self.names = frozenset(meta.find_undeclared_variables(tree))
            refused = StaticCheck().check(tree)
            if refused is not None:
                raise TemplateError(f"template {source!r}: {refused}")
            # every loop, ``~`` and piece of output through the bounds' filters, then compiled
            code = _ENV.compile(Instrument().visit(tree))
            self._compiled = _ENV.template_class.from_code(_ENV, code, _ENV.make_globals(None), None)
        except TemplateError:
            raise
        except TemplateSyntaxError as exc:  # TemplateAssertionError (unknown filter) included
            raise TemplateError(f"template {source!r}: {exc.message}") from None
        except (ValueError, RecursionError, OverflowError) as exc:  # a 5,000-digit literal, deep nesting
            raise TemplateError(f"template {source!r}: {exc}") from None
        self._static = "{{" not in source and "{%" not in source
        self._parts = _simple_parts(source)

    @property
    def static_text(self) -> str | None:
        """The text of a template without placeholders (it renders as itself); None otherwise."""
        return self.source if self._static else None

    def render(self, context: Mapping[str, Any]) -> str:
        if self._static:
            return self.source
        if self._parts is not None:
            out = []
            for part in self._parts:
                if isinstance(part, str):
                    out.append(part)
                    continue
                value = context.get(part[0], _MISSING)
                if part[1] is not None and value is not _MISSING:
                    value = value.get(part[1], _MISSING) if isinstance(value, Mapping) else _MISSING
                out.append("?" if value is _MISSING else str(value))
            return "".join(out)
        token = start_budget()
        try:
            text = self._compiled.render(context)
        except Exception as exc:  # a sandbox refusal, a bound, a type error in a filter: say so, never crash
            return f"<template error: {exc}>"
        finally:
            end_budget(token)
        if len(text) > MAX_TEMPLATE_OUTPUT:
            over = f"rendered {len(text):,} characters, over the bound of {MAX_TEMPLATE_OUTPUT:,}"
            return f"<template error: {over}>"
        return text

    def bind(
        self,
        constants: Mapping[str, str],
        top_level: frozenset[str],
        group_keys: frozenset[str],
        slow_context: Callable[[Any, Mapping[str, Any], int], Mapping[str, Any]],
    ) -> Render:
        """A renderer for one rule, compiled at load: ``(event, group, count) -> str``, equal to ``render``
        on the rule's context. ``constants`` are names whose value is fixed for the rule (``rule``,
        ``severity``), ``top_level`` the event's attributes (``node``), ``group_keys`` what ``group``
        always holds. Simple templates become one generated f-string over the event, its attrs, the count
        and the group; when an attribute they name is absent (it renders ``?``), or the template needs
        anything else, ``slow_context`` builds the full context for ``render``."""
        if self._static:
            text = self.source
            return lambda event, group, count: text

        def slow(event: Any, group: Mapping[str, Any], count: int) -> str:
            return self.render(slow_context(event, group, count))

        ns = Namespace()
        body = self.inline(constants, top_level, group_keys, ns)
        if body is None:
            return slow
        # An f-string is compiled to bytecode once; str.format would parse its format string on every call.
        # An attribute the event lacks (KeyError) renders ``?`` through the full context instead.
        source = (
            "def render(e, g, c):\n"
            "    try:\n"
            f"        return {body}\n"
            "    except KeyError:\n"
            f"        return {ns.bind(slow)}(e, g, c)\n"
        )
        return ns.define(source, "render", "<template>")  # type: ignore[no-any-return]

    def inline(
        self,
        constants: Mapping[str, str],
        top_level: frozenset[str],
        group_keys: frozenset[str],
        ns: Namespace,
    ) -> str | None:
        """The template as an f-string expression over ``e`` (the event), ``e.attrs[...]``, ``c`` (the
        count) and ``g`` (the group), with every piece of text and every name bound in ``ns`` (the source
        holds none of the rule's text); it raises KeyError for an attribute the event lacks. None when a
        placeholder is not one of: a constant, ``count``, ``group.<key>``, a field or ``event.<field>``
        (the context's precedence: its own names, then top-level fields, then attrs). What ``bind`` compiles,
        for a caller's generated code too."""
        if self._static:
            return ns.bind(self.source)
        if self._parts is None:
            return None
        out: list[str] = []
        bound = ns.bind

        for part in self._parts:
            if isinstance(part, str):
                out.append(f"{{{bound(part)}}}")
                continue
            name, sub = part
            if sub is None and name in constants:
                out.append(f"{{{bound(constants[name])}}}")
            elif sub is None and name == "count":
                out.append("{c!s}")
            elif name == "group" and sub in group_keys:
                out.append(f"{{g[{bound(sub)}]!s}}")
            elif (name == "event" and sub is not None) or (sub is None and name not in _CONTEXT_OWN):
                field = sub if name == "event" else name
                assert field is not None
                if field in top_level:  # a fixed set of Event attributes: safe to name in the source
                    assert field.isidentifier()
                    out.append(f"{{e.{field}!s}}")
                else:
                    out.append(f"{{e.attrs[{bound(field)}]!s}}")
            else:
                return None
        return f"f{''.join(out)!r}"


#: ``(event, group, count) -> str``: a template bound to one rule.
Render = Callable[[Any, Mapping[str, Any], int], str]
#: Names the context resolves itself, before the event's fields.
_CONTEXT_OWN = frozenset({"event", "rule", "severity", "count", "group"})


def allowed_names(kinds: frozenset[str] | None) -> frozenset[str]:
    """Names a template may use for a rule matching ``kinds`` (None: any kind)."""
    fields: set[str] = set(COMMON_FIELDS | CONTEXT_NAMES | GPU_FIELDS)
    for kind, names in KIND_FIELDS.items():
        if kinds is None or kind in kinds:
            fields |= names
    return frozenset(fields)
