"""The shipped Grafana dashboard as the tests read it: its panels, their queries, and the queries as Grafana
sends them to Prometheus once the variables are set."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "kubernetes" / "grafana" / "watchd-fleet.json"
SCHEMA = ROOT / "tests" / "data" / "grafana" / "dashboard.schema.json"

#: panels whose data needs Slurm accounting (slurmdbd): served by reports.metrics, tested by tests/reports
ACCOUNTING = "watchd_usage_"


@dataclass(frozen=True)
class Query:
    panel: str
    ref: str
    expr: str


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dash: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    out: list[dict[str, Any]] = []
    for p in (dash or load())["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def queries(dash: dict[str, Any] | None = None) -> list[Query]:
    return [Query(p["title"], t["refId"], t["expr"]) for p in panels(dash) for t in p.get("targets", [])]


def expand(expr: str, values: dict[str, str], rate_interval: str = "1m") -> str:
    """``expr`` as Grafana sends it: ``$cluster``/``$job`` replaced by their regex (several values as
    ``(a|b)``), ``$__rate_interval`` by ``rate_interval``."""
    out = expr.replace("$__rate_interval", rate_interval)
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        out = out.replace("${" + name + "}", value).replace("$" + name, value)
    return out
