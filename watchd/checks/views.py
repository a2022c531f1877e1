"""What the checks subsystem shows (``GET /api/v1/checks``, the engine's status): the configured checks with
their last and next rounds, and where each node stands. Read-only."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from watchd.checks.params import ChecksConfig
from watchd.periodic import Periodic
from watchd.store.checks import CheckRuns

__all__ = ["listing", "status"]


def listing(
    config: ChecksConfig, store: CheckRuns, periodic: Periodic | None, rounds: Mapping[str, str]
) -> list[dict[str, Any]]:
    out = []
    next_runs = periodic.next_runs() if periodic is not None else {}
    for spec in config.items:
        last = store.last_round(spec.name)
        nxt = next_runs.get(f"check:{spec.name}")
        out.append(
            {
                "name": spec.name,
                "type": spec.type,
                "command": spec.argv(),
                "schedule": spec.schedule.model_dump() if spec.schedule is not None else None,
                "partitions": spec.partitions,
                "nodes": spec.nodes,
                "max_share": spec.max_share,
                "time_limit_s": spec.time_limit,
                "in_suite": spec.in_suite,
                "last_round": None if last is None else {"round": last[0], "finished_at": last[2]},
                "round_running": rounds.get(spec.name),
                "next_run": nxt.timestamp() if nxt is not None else None,
            }
        )
    return out


def status(
    config: ChecksConfig,
    store: CheckRuns,
    periodic: Periodic | None,
    rounds: Mapping[str, str],
    now: float,
    *,
    running: Mapping[str, str],
    validating: Collection[str],
    failing: Collection[str],
) -> dict[str, Any]:
    nodes = store.all_nodes()
    return {
        "checks": listing(config, store, periodic, rounds),
        "running": dict(sorted(running.items())),
        "validating": sorted(validating),
        "awaiting_validation": sorted(failing),
        "backing_off": sorted({f"{n.check}:{n.node}" for n in nodes if n.next_try > now}),
        "last": [
            {
                "check": n.check,
                "node": n.node,
                "outcome": n.last_outcome,
                "last_run": n.last_run,
                "last_success": n.last_success,
            }
            for n in sorted(nodes, key=lambda n: (n.check, n.node))[:500]
        ],
    }
