"""Slurm's ``topology.conf`` (the tree plugin), read for one thing: which nodes hang off the same leaf switch.

A line ``SwitchName=leaf1 Nodes=gpu-[001-016]`` names a leaf and its nodes; ``Switches=`` lines (the spine)
are skipped; ``#`` starts a comment; keys are case-insensitive, as Slurm reads them. Pure: text in, a map
out."""

from __future__ import annotations

import re

__all__ = ["expand_hostlist", "leaf_switches"]

_BRACKET = re.compile(r"\[([^\]]*)\]")


def _split_top(expr: str) -> list[str]:
    """Split at commas outside brackets."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p for p in (s.strip() for s in out) if p]


def _range(body: str) -> list[str]:
    items: list[str] = []
    for part in body.split(","):
        lo, sep, hi = part.partition("-")
        if not sep:
            items.append(lo)
            continue
        if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
            raise ValueError(f"bad range {part!r}")
        width = len(lo)
        items.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return items


def expand_hostlist(expr: str) -> list[str]:
    """``gpu-[01-03,07],cpu1`` -> gpu-01 gpu-02 gpu-03 gpu-07 cpu1 (Slurm's hostlist syntax, several bracket
    groups in one name too)."""
    names: list[str] = []
    for item in _split_top(expr):
        partial = [""]
        pos = 0
        for m in _BRACKET.finditer(item):
            prefix = item[pos : m.start()]
            partial = [p + prefix + r for p in partial for r in _range(m.group(1))]
            pos = m.end()
        names.extend(p + item[pos:] for p in partial)
    return names


def leaf_switches(text: str) -> dict[str, str]:
    """node -> its leaf switch, from topology.conf's text (a node under two leaves: the first)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                fields[key.lower()] = value
        switch, nodes = fields.get("switchname"), fields.get("nodes")
        if switch and nodes:
            for node in expand_hostlist(nodes):
                out.setdefault(node, switch)
    return out
