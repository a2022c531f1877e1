"""``watchd drains``: ``sinfo -R`` for the whole fleet, from the running engine (``GET /api/v1/drains``):
every node out of service with its owner class, reason, who, since when and for how long; for watchd's own
the rule, the evidence, the jobs requeued and the actions held; then each partition's availability and
its hot spares."""

from __future__ import annotations

import time
from typing import Any, TextIO
from urllib.parse import urlencode

from watchd.operator_cli import print_json
from watchd.reach import EngineClient


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def _since(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def render(doc: dict[str, Any], out: TextIO, owner: str | None = None) -> None:
    rows = [r for r in doc.get("unavailable", []) if owner is None or r["owner"] == owner]
    print(f"{len(rows)} nodes out of service" + (f" (owner {owner})" if owner else ""), file=out)
    if rows:
        print(
            f"{'NODE':<16} {'OWNER':<9} {'STATE':<22} {'USER':<8} {'SINCE':<19} {'AGE':>7}  REASON", file=out
        )
    for r in rows:
        print(
            f"{r['node']:<16} {r['owner']:<9} {r['state']:<22} {r['user'] or '-':<8} "
            f"{_since(r['since']):<19} {_age(r['age_s']):>7}  {r['reason'] or '-'}",
            file=out,
        )
        w = r.get("watchd")
        if w:
            if w.get("rule"):
                print(
                    f"{'':<18}rule {w['rule']}, event {w.get('event_id')}: {w.get('evidence') or ''}",
                    file=out,
                )
            if w.get("requeued"):
                spare = f" (spare {w['spare']} released for them)" if w.get("spare") else ""
                print(f"{'':<18}requeued jobs: {', '.join(w['requeued'])}{spare}", file=out)
            for h in w.get("held", []):
                print(f"{'':<18}held #{h['id']} {h['kind']} ({h['rule']}): {h['reason']}", file=out)
    print("\npartitions:", file=out)
    for p in doc.get("partitions", []):
        owners = ", ".join(f"{k} {v}" for k, v in sorted(p["by_owner"].items())) or "-"
        spares = (
            f", spares {p['spares']}/{p['spares_wanted']}"
            if p.get("spares_wanted") or p.get("spares")
            else ""
        )
        print(
            f"  {p['partition']:<16} {p['nodes'] - p['unavailable']}/{p['nodes']} in service "
            f"({100 * p['available_share']:.1f}%); out: {owners}{spares}",
            file=out,
        )
    for name, error in (doc.get("errors") or {}).items():
        print(f"\nwarning: {name}: the last listing failed: {error}", file=out)


def run_drains(client: EngineClient, as_json: bool, refresh: bool, owner: str | None, out: TextIO) -> int:
    path = "/api/v1/drains" + (f"?{urlencode({'refresh': '1'})}" if refresh else "")
    doc = client.get(path)
    if as_json:
        if owner is not None:
            doc["unavailable"] = [r for r in doc["unavailable"] if r["owner"] == owner]
        print_json(doc, out)
        return 0
    render(doc, out, owner)
    return 0
