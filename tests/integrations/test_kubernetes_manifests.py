"""deploy/kubernetes: the alert rules pass promtool and the dashboard loads. The manifests themselves (the
kustomizations, their schemas, Pod Security, NetworkPolicies, the RBAC held to the code's calls) are tested in
tests/deploy/."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy" / "kubernetes"


@pytest.mark.real
def test_alert_rules_pass_promtool(promtool: str) -> None:
    alerts = DEPLOY / "alerts"
    for args in (["check", "rules", "watchd-alerts.yaml"], ["test", "rules", "watchd-alerts.test.yaml"]):
        r = subprocess.run([promtool, *args], cwd=alerts, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    amtool = shutil.which("amtool")
    assert amtool is not None
    r = subprocess.run(
        [amtool, "check-config", str(alerts / "alertmanager-route.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_grafana_dashboard() -> None:
    dash = json.loads((DEPLOY / "grafana" / "watchd-fleet.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(dash["panels"]) >= 8 and all("watchd_" in e or "up{" in e for e in exprs)
