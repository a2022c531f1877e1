"""The operator's commands, ``watchd status``, ``watchd actions ...`` and ``watchd node resume``: calls to a
running engine's HTTP API, printed for people. (Not to be confused with :mod:`watchd.client`, the heartbeat
client that training jobs import.)"""

from __future__ import annotations

import getpass
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote, urlencode

from watchd.errors import UsageError

DEFAULT_URL = "http://127.0.0.1:9120"


def _token(token_file: Path | None) -> str | None:
    if token_file is not None:
        try:
            return token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(f"--token-file {token_file}: {exc.strerror}") from None
    return os.environ.get("WATCHD_TOKEN") or None


def _tls() -> ssl.SSLContext | None:
    """TLS for an https:// engine from the environment: ``WATCHD_CA_FILE`` (the engine's CA; default the
    system's), ``WATCHD_CLIENT_CERT``/``WATCHD_CLIENT_KEY`` (mutual TLS). docs/security.md."""
    ca = os.environ.get("WATCHD_CA_FILE") or None
    cert = os.environ.get("WATCHD_CLIENT_CERT") or None
    key = os.environ.get("WATCHD_CLIENT_KEY") or None
    if ca is None and cert is None:
        return None
    if (cert is None) != (key is None):
        raise UsageError("set WATCHD_CLIENT_CERT and WATCHD_CLIENT_KEY together")
    try:
        context = ssl.create_default_context(cafile=ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert is not None:
            context.load_cert_chain(cert, key)
        return context
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"WATCHD_CA_FILE/WATCHD_CLIENT_CERT/WATCHD_CLIENT_KEY: cannot load: {exc}") from None


def _call(url: str, path: str, method: str = "GET", token: str | None = None, by: str = "") -> Any:
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--url {url}: expected http:// or https://")
    if token is None:
        token = _token(None)  # reads need a credential too where the engine has any (a viewer's token)
    request = urllib.request.Request(
        f"{url.rstrip('/')}{path}", method=method, data=b"" if method == "POST" else None
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if by:
        request.add_header("X-Watchd-Operator", by)
    try:
        with urllib.request.urlopen(request, timeout=10, context=_tls()) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
        except ValueError:
            body = {}
        if "outcome" in body:  # the engine did what was asked and says how it went (not_held, refused, ...)
            return body
        raise UsageError(f"{url}{path}: HTTP {exc.code}: {body.get('error', exc.reason)}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UsageError(
            f"cannot reach the engine at {url}: {reason} (is `watchd engine` running?)"
        ) from None


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def run_status(
    url: str, as_json: bool, out: TextIO, limit: int | None = None, node: str | None = None
) -> int:
    query = {k: str(v) for k, v in (("limit", limit), ("node", node)) if v is not None}
    path = "/api/v1/status" + (f"?{urlencode(query)}" if query else "")
    status = _call(url, path)
    if as_json:
        print(json.dumps(status, indent=2), file=out)
        return 0
    print(
        f"engine {url}: mode {status['mode']}, scheduler {status['scheduler']}, "
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


def run_actions(
    verb: str, ids: list[int], url: str, token_file: Path | None, by: str | None, out: TextIO
) -> int:
    if verb == "list":
        _print_held(_call(url, "/api/v1/held")["held"], out)
        return 0
    if not ids:
        raise UsageError(f"actions {verb}: name the held action ids (see `watchd actions list`)")
    token = _token(token_file)
    operator = by or getpass.getuser()
    failed = 0
    for held_id in ids:
        result = _call(url, f"/api/v1/held/{held_id}/{verb}", "POST", token, operator)
        print(f"#{held_id}: {result['outcome']}: {result['detail']}", file=out)
        failed += result["outcome"] in ("not_held", "failed")
    return 1 if failed else 0


def engine_address(config_path: Path | None) -> tuple[str, str | None]:
    """The URL and token of the engine that ``config_path`` configures (its listen address and auth)."""
    from watchd.config import EngineConfig, load_config

    config = load_config(EngineConfig, config_path)
    host = config.listen.host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{config.listen.port}", config.auth.resolve()


def run_resume(
    node: str,
    url: str | None,
    token_file: Path | None,
    by: str | None,
    config_path: Path | None,
    out: TextIO,
) -> int:
    """Ask the running engine to resume ``node``: the executor carries it out and audits it; the scheduler
    refuses a node watchd did not drain. Exit 0 when the node is in service afterwards."""
    token = _token(token_file)
    if config_path is not None:
        from_config, config_token = engine_address(config_path)
        url = url or from_config
        token = token if token_file is not None else (config_token or token)
    url = url or DEFAULT_URL
    operator = by or getpass.getuser()
    result = _call(url, f"/api/v1/nodes/{quote(node, safe='')}/resume", "POST", token, operator)
    print(f"{node}: {result['outcome']}" + (f" ({result['detail']})" if result["detail"] else ""), file=out)
    return 0 if result["outcome"] in ("resumed", "not_drained") else 1


def run_history(
    node: str,
    url: str | None,
    token_file: Path | None,
    config_path: Path | None,
    limit: int,
    as_json: bool,
    out: TextIO,
) -> int:
    """``watchd node history NODE``: the node's incidents, newest first, each from the evidence that took it
    out to its return to service, with every step between."""
    token = _token(token_file)
    if config_path is not None:
        from_config, config_token = engine_address(config_path)
        url = url or from_config
        token = token if token_file is not None else (config_token or token)
    path = f"/api/v1/nodes/{quote(node, safe='')}/history?limit={limit}"
    doc = _call(url or DEFAULT_URL, path, token=token)
    if as_json:
        print(json.dumps(doc, indent=2), file=out)
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
