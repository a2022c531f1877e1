"""The rewrite of a parsed template that makes every loop iteration, ``~`` and piece of output a step of the
render's budget, through the internal filters here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jinja2 import nodes
from jinja2.utils import pass_context
from jinja2.visitor import NodeTransformer

from watchd.rules.bounds.budget import (
    BUDGET,
    MAX_TEMPLATE_OUTPUT,
    MAX_TEMPLATE_WRITTEN,
    TemplateBoundError,
    step,
)
from watchd.rules.bounds.sizes import text_size, too_big


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
        raise too_big("a piece of output", size)
    b = BUDGET.get()
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
        raise too_big("a ~ concatenation", size)
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
