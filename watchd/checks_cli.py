"""``watchd checks list|run NODE...|history NODE|plan`` and ``watchd node validate NODE``: calls to the
running engine's API, printed for people (``--json`` for the documents)."""

from __future__ import annotations

import getpass
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from watchd.errors import UsageError
from watchd.operator_cli import DEFAULT_URL, _call, _token, engine_address

__all__ = ["run_checks", "run_validate"]


def _post_json(url: str, path: str, body: Any, token: str | None, by: str, timeout: float) -> Any:
    request = urllib.request.Request(
        f"{url.rstrip('/')}{path}",
        method="POST",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    request.add_header("X-Watchd-Operator", by)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            answer = json.loads(exc.read())
        except ValueError:
            answer = {}
        if "outcome" in answer:
            return answer
        raise UsageError(f"{url}{path}: HTTP {exc.code}: {answer.get('error', exc.reason)}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise UsageError(f"cannot reach the engine at {url}: {getattr(exc, 'reason', exc)}") from None


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _address(url: str | None, token_file: Path | None, config: Path | None) -> tuple[str, str | None]:
    token = _token(token_file)
    if config is not None:
        from_config, config_token = engine_address(config)
        url = url or from_config
        token = token if token_file is not None else (config_token or token)
    return url or DEFAULT_URL, token


def run_checks(
    verb: str,
    nodes: list[str],
    names: list[str],
    url: str | None,
    token_file: Path | None,
    config: Path | None,
    by: str | None,
    as_json: bool,
    timeout: float,
    out: TextIO,
) -> int:
    url, token = _address(url, token_file, config)
    if verb == "list":
        doc = _call(url, "/api/v1/checks", token=token)
        if as_json:
            print(json.dumps(doc, indent=2), file=out)
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
        return _plan(url, token, names, as_json, out)
    if not nodes:
        raise UsageError(f"checks {verb}: name the node(s)")
    if verb == "history":
        rc = 0
        for node in nodes:
            doc = _call(url, f"/api/v1/checks/history/{quote(node, safe='')}", token=token)
            if as_json:
                print(json.dumps(doc, indent=2), file=out)
                continue
            print(f"{node}:", file=out)
            for r in doc["runs"]:
                print(
                    f"  {_when(r['started_at'])} {r['check']:<14} {r['outcome'] or 'running':<8}"
                    f" job {r['job'] or '-':<8} {r['round']}: {r['evidence']}",
                    file=out,
                )
        return rc
    doc = _post_json(
        url, "/api/v1/checks/run", {"nodes": nodes, "checks": names}, token, by or getpass.getuser(), timeout
    )
    if as_json:
        print(json.dumps(doc, indent=2), file=out)
    else:
        for r in doc["results"]:
            print(f"{r['node']:<16} {r.get('check') or '-':<14} {r['outcome']:<8} {r['evidence']}", file=out)
    return 0 if all(r["passed"] for r in doc["results"]) else 1


def _plan(url: str, token: str | None, names: list[str], as_json: bool, out: TextIO) -> int:
    query = f"?check={quote(names[0], safe='')}" if names else ""
    doc = _call(url, f"/api/v1/checks/plan{query}", token=token)
    if as_json:
        print(json.dumps(doc, indent=2), file=out)
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


def run_validate(
    node: str,
    url: str | None,
    token_file: Path | None,
    config: Path | None,
    by: str | None,
    timeout: float,
    out: TextIO,
) -> int:
    url, token = _address(url, token_file, config)
    doc = _post_json(
        url, f"/api/v1/nodes/{quote(node, safe='')}/validate", {}, token, by or getpass.getuser(), timeout
    )
    for r in doc.get("results", []):
        print(f"  {r.get('check') or '-':<14} {r['outcome']:<8} {r['evidence']}", file=out)
    print(f"{node}: {doc['outcome']}" + (f" ({doc['detail']})" if doc.get("detail") else ""), file=out)
    return 0 if doc["outcome"] == "resumed" else 1
