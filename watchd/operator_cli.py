"""The operator's commands, ``watchd status``, ``watchd actions ...``, ``watchd node resume|history``: calls
to a running engine's HTTP API (reached through :mod:`watchd.reach`), printed for people or as JSON. (Not to
be confused with :mod:`watchd.client`, the heartbeat client that training jobs import.)"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from typing import Any, TextIO
from urllib.parse import quote, urlencode

from watchd.errors import EXIT_FAILED, EXIT_REFUSED, UsageError
from watchd.reach import Answer, EngineClient


def print_json(doc: Any, out: TextIO) -> None:
    """A command's ``--json``: the engine's document, as it sent it."""
    print(json.dumps(doc, indent=2), file=out)


def exit_for(answer: Answer, ok: Collection[str] | None = None, failed: Collection[str] = ()) -> int:
    """The exit status of an action: 4 when the engine refused it (HTTP 409 or the outcome ``refused``: a
    node someone else drained, a validation already running); else 0 when its outcome is one of ``ok`` (or,
    without ``ok``, not one of ``failed``); else 1."""
    outcome = answer.doc.get("outcome")
    if answer.status == 409 or outcome == "refused":
        return EXIT_REFUSED
    good = outcome in ok if ok is not None else outcome not in failed
    return 0 if good else EXIT_FAILED


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def run_status(
    client: EngineClient, as_json: bool, out: TextIO, limit: int | None = None, node: str | None = None
) -> int:
    query = {k: str(v) for k, v in (("limit", limit), ("node", node)) if v is not None}
    path = "/api/v1/status" + (f"?{urlencode(query)}" if query else "")
    status = client.get(path)
    if as_json:
        print_json(status, out)
        return 0
    print(
        f"engine {client.url}: mode {status['mode']}, scheduler {status['scheduler']}, "
        f"{len(status['rules'])} rules, queue {status['queue_depth']}",
        file=out,
    )
    print("\nbreaker (nodes taken out by watchd within the window / limit):", file=out)
    for pool in status["breaker"]:
        print(
            f"  {pool['pool']:<16} {pool.get('taken_out_count', len(pool['taken_out']))}/{pool['limit']} "
            f"of {pool['size']} nodes"
            + (f": {', '.join(pool['taken_out'][:10])}" if pool["taken_out"] else ""),
            file=out,
        )
    _print_held(status["held"], out, status.get("held_total"))
    nodes = status.get("nodes", [])
    troubled = [n for n in nodes if n["recent_faults"] or n["lost_gpus"] or n["held"]]
    total = status.get("nodes_total", len(nodes))
    shown = f" ({len(nodes)} shown, troubled first)" if total > len(nodes) else ""
    print(
        f"\nnodes: {total} reporting{shown}; {len(troubled)} with faults (24 h), lost GPUs or held actions:",
        file=out,
    )
    for n in troubled[:20]:
        lost = f", lost GPUs {n['lost_gpus']}" if n["lost_gpus"] else ""
        held = f", {n['held']} held" if n["held"] else ""
        print(
            f"  {n['node']:<16} {n['gpus']} GPUs, jobs {', '.join(n['jobs']) or '-'}, "
            f"{n['recent_faults']} faults (last: {n['last_fault'] or '-'}){lost}{held}",
            file=out,
        )
    print(f"\nincidents ({len(status['incidents'])} nodes):", file=out)
    for incident in status["incidents"]:
        last = incident["actions"][-1]
        print(
            f"  {incident['node']:<16} {last['action']} {last['outcome']} by {last['rule']} "
            f"at {_when(last['time'])}: {last['detail']}",
            file=out,
        )
    recent = status.get("recent_actions", [])[-10:]
    print(f"\nrecent actions (last {len(recent)}):", file=out)
    for a in recent:
        print(
            f"  {_when(a['time'])} {a['action']:<8} {a['node']:<16} {a['outcome']:<14} {a['rule']}: "
            f"{a['detail']}",
            file=out,
        )
    if status.get("alerts"):
        print(f"\nfiring alerts: {len(status['alerts'])}", file=out)
    return 0


def _print_held(held: list[dict[str, Any]], out: TextIO, total: int | None = None) -> None:
    more = (
        f", the newest {len(held)} shown: `watchd actions list` lists all"
        if total and total > len(held)
        else ""
    )
    print(f"\nheld actions ({total if total is not None else len(held)}{more}):", file=out)
    for h in held:
        print(
            f"  #{h['id']:<5} {h['kind']:<8} {h['node']:<16} rule {h['rule']}, held {_when(h['held_at'])}",
            file=out,
        )
        print(f"         {h['reason']}", file=out)
        if evidence := _evidence(h.get("event") or {}):
            print(f"         evidence: {evidence}", file=out)


def _evidence(event: dict[str, Any]) -> str:
    """The event a held action was decided on, in one line: its kind and the fields that say what broke."""
    if not event:
        return ""
    attrs = event.get("attrs") or {}
    shown = [f"{k}={attrs[k]}" for k in _EVIDENCE_FIELDS if attrs.get(k) not in (None, "")]
    when = f" at {_when(event['time'])}" if isinstance(event.get("time"), int | float) else ""
    return f"{event.get('kind', '?')}{when} " + " ".join(shown)


_EVIDENCE_FIELDS = ("xid", "pci_bus_id", "gpu", "condition", "value", "meaning", "evidence", "job")


def run_actions(verb: str, ids: list[int], client: EngineClient, as_json: bool, out: TextIO) -> int:
    """``watchd actions list|release ID...|discard ID...``: exit 0 when every id was released (discarded),
    4 when the engine refused one, else 1."""
    if verb == "list":
        doc = client.get("/api/v1/held")
        if as_json:
            print_json(doc, out)
        else:
            _print_held(doc["held"], out)
        return 0
    if not ids:
        raise UsageError(f"actions {verb}: name the held action ids (see `watchd actions list`)")
    results: list[dict[str, Any]] = []
    worst = 0
    for held_id in ids:
        answer = client.post(f"/api/v1/held/{held_id}/{verb}")
        results.append({"id": held_id, **answer.doc})
        if not as_json:
            print(f"#{held_id}: {answer.doc['outcome']}: {answer.doc.get('detail', '')}", file=out)
        code = exit_for(answer, failed=("not_held", "failed"))
        worst = code if worst == 0 or code == EXIT_REFUSED else worst
    if as_json:
        print_json({"results": results}, out)
    return worst


def run_resume(node: str, client: EngineClient, as_json: bool, out: TextIO) -> int:
    """Ask the running engine to resume ``node``: the executor carries it out and audits it; the scheduler
    refuses a node watchd did not drain (exit 4). Exit 0 when the node is in service afterwards."""
    answer = client.post(f"/api/v1/nodes/{quote(node, safe='')}/resume")
    return _node_answer(node, answer, ("resumed", "not_drained"), as_json, out)


def run_unmark(node: str, why: str, mark: str, client: EngineClient, as_json: bool, out: TextIO) -> int:
    """Ask the running engine to clear the marks of ``node`` (the ``unmark`` action, audited). Exit 0 when
    the node carries no such mark afterwards."""
    answer = client.post(f"/api/v1/nodes/{quote(node, safe='')}/unmark", {"why": why, "mark": mark})
    return _node_answer(node, answer, ("cleared", "not_marked"), as_json, out)


def _node_answer(node: str, answer: Answer, ok: Collection[str], as_json: bool, out: TextIO) -> int:
    """An action on one node as the engine answered it: a line (or the JSON), and its exit status."""
    result = answer.doc
    if as_json:
        print_json({"node": node, **result}, out)
    else:
        detail = f" ({result['detail']})" if result.get("detail") else ""
        print(f"{node}: {result.get('outcome', result.get('error', ''))}{detail}", file=out)
    return exit_for(answer, ok)


def run_marks(node: str | None, client: EngineClient, as_json: bool, out: TextIO) -> int:
    """``watchd node marks [NODE]``: every open mark of the fleet, or one node's marks, cleared ones too."""
    doc = client.get(f"/api/v1/nodes/{quote(node, safe='')}/marks" if node else "/api/v1/marks")
    if as_json:
        print_json(doc, out)
        return 0
    marks = doc.get("history", []) if node else doc.get("marks", [])
    if not marks:
        print(f"{node}: no mark" if node else "no node is marked", file=out)
    for m in marks:
        state = (
            "open"
            if m.get("cleared_at") is None
            else f"cleared {_when(m['cleared_at'])} by {m['cleared_by']}"
        )
        print(
            f"{m['node']}: {m['mark']} since {_when(m['set_at'])} ({state}): rule {m['rule']}: {m['detail']}",
            file=out,
        )
        if m.get("cleared_why"):
            print(f"  why: {m['cleared_why']}", file=out)
    return 0


def run_history(node: str, client: EngineClient, limit: int, as_json: bool, out: TextIO) -> int:
    """``watchd node history NODE``: the node's incidents, newest first, each from the evidence that took it
    out to its return to service, with every step between."""
    doc = client.get(f"/api/v1/nodes/{quote(node, safe='')}/history?limit={limit}")
    if as_json:
        print_json(doc, out)
        return 0
    found = doc.get("incidents", [])
    if not found:
        print(f"{node}: no incident in the audit trail", file=out)
    for inc in found:
        took = f", {inc['duration_s']:.0f} s out of service" if inc.get("duration_s") is not None else ""
        print(f"{node}: {inc['state']} since {_when(inc['opened_at'])}{took}: {inc['evidence']}", file=out)
        for step in inc["steps"]:
            line = f"  {_when(step['time'])}  {step['action']:<13} {step['outcome']:<18} {step['by']}"
            print(line + (f": {step['detail']}" if step.get("detail") else ""), file=out)
    return 0
