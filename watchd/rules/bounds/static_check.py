"""What a template can only break, refused at load: found in the parsed template, without rendering it."""

from __future__ import annotations

import string

from jinja2 import nodes
from jinja2.visitor import NodeVisitor

from watchd.rules.bounds.budget import (
    MAX_TEMPLATE_INT_BITS,
    MAX_TEMPLATE_OUTPUT,
    MAX_TEMPLATE_POWER,
    MAX_TEMPLATE_STEPS,
    TemplateBoundError,
)
from watchd.rules.bounds.operations import PERCENT, WIDTH_METHODS, check_spec


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
            width = self.const_int(node.args[0]) if node.node.attr in WIDTH_METHODS else None
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
        if attr in WIDTH_METHODS | {"expandtabs", "to_bytes"} and node.args:
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
        for m in PERCENT.finditer(fmt.encode("utf-8", "surrogatepass")):
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
