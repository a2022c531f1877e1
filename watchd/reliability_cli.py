"""``watchd reliability``: the engine's reliability accounting and checkpoint advice, printed for people
(docs/reliability.md). A call to a running engine's ``GET /api/v1/reliability``."""

from __future__ import annotations

import json
import time
from typing import Any, TextIO
from urllib.parse import urlencode

from watchd.reach import EngineClient

FEW_FAILURES = 5  # fewer: the interval is wide, and the output says so


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _h(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _estimate(e: dict[str, Any], level: str) -> str:
    if e["failures"] == 0:
        if e["mtbf_lower_hours"] is None:
            return "no exposure measured yet"
        lower = _h(e["mtbf_lower_hours"])
        return f"no failure in {_h(e['exposure_hours'])} node-h: MTBF > {lower} h ({level} lower bound)"
    few = " (few failures: wide interval)" if e["failures"] < FEW_FAILURES else ""
    return (
        f"{e['failures']} failure{'s' if e['failures'] != 1 else ''} in {_h(e['exposure_hours'])} node-h: "
        f"MTBF {_h(e['mtbf_hours'])} h "
        f"({level}: {_h(e['mtbf_lower_hours'])} - {_h(e['mtbf_upper_hours'])} h){few}"
    )


def _table(title: str, groups: dict[str, dict[str, Any]], level: str, out: TextIO) -> None:
    if not groups:
        return
    print(f"\nby {title}:", file=out)
    width = max(len(k) for k in groups)
    for name, e in groups.items():
        print(f"  {name:<{width}}  {_estimate(e, level)}", file=out)


def render(doc: dict[str, Any], out: TextIO) -> None:
    level = f"{round(doc['confidence'] * 100)}%"
    days = (doc["now"] - doc["since"]) / 86400.0
    age = doc.get("report_age_s")  # absent from an engine before the report cache
    print(
        f"reliability since {_utc(doc['since'])} ({days:.1f} days), "
        f"partition {doc.get('partition') or 'all'}"
        + (f" (report {age:.0f} s old)" if age is not None else ""),
        file=out,
    )
    print(f"estimator: {doc['estimator']}", file=out)
    print(f"\nfleet: {_estimate(doc['fleet'], level)}", file=out)
    _table("partition", doc["partitions"], level, out)
    _table("GPU model", doc["gpu_models"], level, out)
    failing = {n: e for n, e in doc["nodes"].items() if e["failures"] > 0}
    if failing:
        _table("node (failing)", dict(list(failing.items())[:20]), level, out)
    print(
        f"\nGPU-hours lost: {_h(doc['gpu_hours_lost'])} (node-hours out of service after failures: "
        f"{_h(doc['node_hours_lost'])})",
        file=out,
    )
    if doc["lemons"]:
        print(
            "lemons: " + ", ".join(f"{x['node']} ({x['failures']} failures)" for x in doc["lemons"]), file=out
        )
    else:
        print("lemons: none", file=out)
    if doc["failures"]:
        print("\nfailures (oldest first):", file=out)
        for f in doc["failures"][-50:]:
            back = "still out" if f["back_at"] is None else f"back after {_h(f['out_hours'])} h"
            print(
                f"  {_utc(f['time'])}  {f['node']}  {f['evidence']}  rule {f['rule']}  {f['mode']}  {back}  "
                f"{_h(f['gpu_hours_lost'])} GPU-h",
                file=out,
            )
    if "job" in doc:
        print("", file=out)
        _advice(doc["job"], out)
    elif doc.get("jobs"):
        print("\ncheckpoint advice (running jobs):", file=out)
        for a in doc["jobs"]:
            _advice(a, out)


def _advice(a: dict[str, Any], out: TextIO) -> None:
    if a.get("advised_interval_s") is None:
        print(f"  job {a['job']}: no advice ({a.get('why', 'unknown')})", file=out)
        return
    current = a["current_interval_s"]
    now = (
        "current interval unknown"
        if current is None
        else f"current {current / 60:.1f} min ({a['current_basis']}), "
        f"expected loss {100 * a['waste_current']:.2f}%"
    )
    flag = "  << far less often than advised" if a["far_too_long"] else ""
    print(
        f"  job {a['job']} on {a['nodes']} node{'s' if a['nodes'] != 1 else ''}: "
        f"checkpoint {a['checkpoint_cost_s']:.1f} s ({a['cost_source']}), "
        f"job MTBF {a['job_mtbf_hours']:.2f} h (node {a['node_mtbf_hours']:.1f} h, {a['mtbf_basis']})\n"
        f"    advised {a['advised_interval_s'] / 60:.1f} min "
        f"(Daly; Young {a['young_interval_s'] / 60:.1f} min), "
        f"expected loss {100 * a['waste_advised']:.2f}%; {now}{flag}",
        file=out,
    )


def run_reliability(
    client: EngineClient,
    as_json: bool,
    out: TextIO,
    *,
    partition: str | None = None,
    since: str | None = None,
    job: str | None = None,
) -> int:
    query = {k: v for k, v in (("partition", partition), ("since", since), ("job", job)) if v}
    doc = client.get("/api/v1/reliability" + (f"?{urlencode(query)}" if query else ""))
    if as_json:
        json.dump(doc, out, indent=2, sort_keys=True)
        out.write("\n")
    else:
        render(doc, out)
    return 0
