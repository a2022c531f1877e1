"""The shipped Grafana dashboard's usage panels: valid PromQL (promtool), over metrics the report serves."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from watchd.reports.core import build_report
from watchd.reports.metrics import to_prometheus
from watchd.reports.model import Accounting, GpuUse, JobRecord, Observed, PendingJob, ShareRecord

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "grafana" / "watchd-fleet.json"


def _usage_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", []) if "watchd_usage_" in t["expr"]]


def test_usage_panels_use_served_metrics() -> None:
    exprs = _usage_exprs()
    assert len(exprs) >= 8
    rep = build_report(
        Accounting(
            True,
            jobs=(JobRecord("1", "a", "u", "gpu", 2, 0.0, 10.0, 3610.0, "COMPLETED"),),
            shares=(
                ShareRecord("a", None, 1, 1.0, 5.0, 1.0, None, 1.0),
                ShareRecord("a", "u", 1, 1.0, 5.0, 1.0, 0.5, 1.0),
            ),
            pending=(PendingJob("2", "a", "u", "gpu", 1, 0.0, "Priority"),),
        ),
        Observed(gpus=(GpuUse("1", "n", 0, 1e6, 3600.0, 60.0, 10.0, 3610.0),)),
        start=0.0,
        end=7200.0,
        now=7200.0,
        by=("account", "partition"),
    )
    served = set(re.findall(r"^(watchd_usage_\w+)", to_prometheus(rep), re.M))
    for expr in exprs:
        for name in re.findall(r"watchd_usage_\w+", expr):
            assert name in served, f"{name} (in {expr!r}) is not served"


def test_usage_panels_are_valid_promql(tmp_path: Path, promtool: str) -> None:
    rules = {
        "groups": [
            {
                "name": "panels",
                "rules": [{"record": f"panel:expr{i}", "expr": e} for i, e in enumerate(_usage_exprs())],
            }
        ]
    }
    f = tmp_path / "panels.yaml"
    f.write_text(yaml.safe_dump(rules))
    res = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
