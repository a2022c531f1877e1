"""Slurm's ``topology.conf`` (the tree plugin), read for one thing: which nodes hang off the same leaf switch.

A line ``SwitchName=leaf1 Nodes=gpu-[001-016]`` names a leaf and its nodes; ``Switches=`` lines (the spine)
are skipped; ``#`` starts a comment; keys are case-insensitive, as Slurm reads them. Pure: text in, a map
out."""

from __future__ import annotations

from pathlib import Path

from watchd.logs import get_logger
from watchd.model.hostlist import expand_hostlist

_log = get_logger("watchd.checks.topology")

__all__ = ["leaf_switches", "read_leaf_switches"]


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


def read_leaf_switches(path: Path | None) -> dict[str, str]:
    """:func:`leaf_switches` of the file at ``path`` (``checks.risk.topology``); {} without one, and {} with
    an error logged when it cannot be read."""
    if path is None:
        return {}
    try:
        return leaf_switches(path.read_text())
    except (OSError, ValueError) as exc:
        _log.error("checks_topology_unreadable", path=str(path), error=str(exc))
        return {}
