"""Which pools (Slurm partitions) each node belongs to: the blast-radius breaker counts per pool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class Pools:
    """Which pools (Slurm partitions) each node belongs to, and their sizes; refreshed by the engine."""

    of_node: dict[str, list[str]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_members(cls, members: Mapping[str, list[str]]) -> Pools:
        of_node: dict[str, list[str]] = {}
        for pool, nodes in members.items():
            for node in nodes:
                of_node.setdefault(node, []).append(pool)
        return cls(of_node, {pool: len(nodes) for pool, nodes in members.items()})

    def pools(self, node: str) -> list[str]:
        return self.of_node.get(node) or ["all"]
