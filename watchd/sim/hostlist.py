"""Slurm-style host lists (``sim-[1-4,7]``) and the node selectors of a fleet file: a host list, or a list
of them."""

from __future__ import annotations

from watchd.model.hostlist import MAX_NODES, expand_hostlist

__all__ = ["MAX_NODES", "NodeSelector", "expand_hostlist", "select_nodes"]

NodeSelector = str | tuple[str, ...]


def select_nodes(selector: NodeSelector) -> list[str]:
    parts = [selector] if isinstance(selector, str) else list(selector)
    return list(dict.fromkeys(n for p in parts for n in expand_hostlist(p)))
