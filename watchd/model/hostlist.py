"""Slurm's host-list syntax (``gpu-[1-4,7]``, ``a-[01-10]``, ``gpu-1,gpu-5``, several bracket groups in one
name): the names of nodes as Slurm prints them and as its config files write them. Pure."""

from __future__ import annotations

import re

__all__ = ["MAX_NODES", "expand_hostlist"]

#: The most nodes a fleet may have (and a host-list range may name).
MAX_NODES = 100_000

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(expr: str) -> list[str]:
    """Slurm-style host lists: ``sim-3``, ``sim-[1-4,7]``, ``a-[01-10]``, ``sim-1,sim-5`` (in order, no
    duplicates). Raises ValueError on a malformed expression."""
    out: list[str] = []
    depth, part = 0, ""
    for ch in expr + ",":
        if ch == "," and depth == 0:
            if not part.strip():
                raise ValueError(f"empty name in {expr!r}")
            out.extend(_expand_one(part.strip()))
            part = ""
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in {expr!r}")
        part += ch
    if depth:
        raise ValueError(f"unbalanced brackets in {expr!r}")
    return list(dict.fromkeys(out))


def _expand_one(part: str) -> list[str]:
    m = _BRACKET.search(part)
    if m is None:
        if "[" in part or "]" in part:
            raise ValueError(f"unbalanced brackets in {part!r}")
        return [part]
    head, tail = part[: m.start()], part[m.end() :]
    out: list[str] = []
    for item in m.group(1).split(","):
        lo, sep, hi = item.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {item!r} in {part!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"range {item!r} goes backwards in {part!r}")
        if last - first >= MAX_NODES:
            raise ValueError(f"range {item!r} is too large in {part!r}")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        for i in range(first, last + 1):
            out.extend(_expand_one(f"{head}{i:0{width}d}{tail}"))
    return out
