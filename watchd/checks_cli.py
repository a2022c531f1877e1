"""``watchd checks list|run NODE...|history NODE|plan`` and ``watchd node validate NODE``: calls to the
running engine's API, printed for people (``--json`` for the documents)."""

from __future__ import annotations

import time
from typing import TextIO
from urllib.parse import quote

from watchd.errors import UsageError
from watchd.operator_cli import exit_for, print_json
from watchd.reach import CHECKS, EngineClient

__all__ = ["run_checks", "run_validate"]


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def run_checks(
    verb: str,
    nodes: list[str],
    names: list[str],
    client: EngineClient,
    as_json: bool,
    timeout: float,
    out: TextIO,
) -> int:
    if verb == "list":
        doc = client.get("/api/v1/checks", feature=CHECKS)
        if as_json:
            print_json(doc, out)
            return 0
        for c in doc["checks"]:
            sched = c["schedule"] or {}
            when = f"every {sched['every']:g}s" if sched.get("every") else sched.get("cron") or "on demand"
            last = c["last_round"] or {}
            print(
                f"{c['name']:<16} {c['type']:<10} {when:<18} partitions {','.join(c['partitions']) or '-'} "
                f"nodes {','.join(c['nodes']) or '-'} share {c['max_share']:g} limit {c['time_limit_s']:g}s"
                f"{' suite' if c['in_suite'] else ''}; last round {last.get('round', '-')}"
                f"{' (running)' if c['round_running'] else ''}; next {_when(c['next_run'])}",
                file=out,
            )
            print(f"  {' '.join(c['command'])}", file=out)
        return 0
    if verb == "plan":
        return _plan(client, names, as_json, out)
    if not nodes:
        raise UsageError(f"checks {verb}: name the node(s)")
    if verb == "history":
        rc = 0
        for node in nodes:
            doc = client.get(f"/api/v1/checks/history/{quote(node, safe='')}", feature=CHECKS)
            if as_json:
                print_json(doc, out)
                continue
            print(f"{node}:", file=out)
            for r in doc["runs"]:
                print(
                    f"  {_when(r['started_at'])} {r['check']:<14} {r['outcome'] or 'running':<8}"
                    f" job {r['job'] or '-':<8} {r['round']}: {r['evidence']}",
                    file=out,
                )
        return rc
    waiting = f"checks run on {', '.join(nodes[:3])}{' ...' if len(nodes) > 3 else ''}"
    answer = client.post(
        "/api/v1/checks/run",
        {"nodes": nodes, "checks": names},
        feature=CHECKS,
        timeout_s=timeout,
        waiting=waiting,
    )
    doc = answer.doc
    if as_json:
        print_json(doc, out)
    else:
        for r in doc["results"]:
            print(f"{r['node']:<16} {r.get('check') or '-':<14} {r['outcome']:<8} {r['evidence']}", file=out)
    return 0 if all(r["passed"] for r in doc["results"]) else 1


def _plan(client: EngineClient, names: list[str], as_json: bool, out: TextIO) -> int:
    query = f"?check={quote(names[0], safe='')}" if names else ""
    doc = client.get(f"/api/v1/checks/plan{query}", feature=CHECKS)
    if as_json:
        print_json(doc, out)
        return 0
    for p in doc["plans"]:
        budget = p["budget"]
        spend = (
            f"budget {budget['gpu_hours']:g} GPU-hours per {budget['per_s'] / 3600:g} h per partition, spent "
            + (", ".join(f"{k} {v:g}" for k, v in budget["spent"].items()) or "none")
            + f"; floor: every node at least every {budget['max_interval_s'] / 86400:g} days"
            if budget
            else "no budget"
        )
        print(f"{p['check']}: planner {p['planner']}; {spend}; a run ~{p['run_duration_s']:.0f} s", file=out)
        for r in p["nodes"]:
            print(
                f"  {r['rank']:>4} {r['node']:<16} risk {r['probability']:>6.1%}  {r['plan']:<28} {r['why']}",
                file=out,
            )
    return 0


def run_validate(node: str, client: EngineClient, timeout: float, as_json: bool, out: TextIO) -> int:
    """``watchd node validate NODE``: the check suite on a node watchd drained, and its return to service if
    every check passes. Exit 0 when it is back, 4 when the engine refused (not watchd's drain, a validation
    already running), else 1."""
    answer = client.post(
        f"/api/v1/nodes/{quote(node, safe='')}/validate",
        feature=CHECKS,
        timeout_s=timeout,
        waiting=f"validating {node} (the check suite, then its return to service)",
    )
    doc = answer.doc
    if as_json:
        print_json({"node": node, **doc}, out)
        return exit_for(answer, ("resumed",))
    for r in doc.get("results", []):
        print(f"  {r.get('check') or '-':<14} {r['outcome']:<8} {r['evidence']}", file=out)
    print(f"{node}: {doc['outcome']}" + (f" ({doc['detail']})" if doc.get("detail") else ""), file=out)
    return exit_for(answer, ("resumed",))
