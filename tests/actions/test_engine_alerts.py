"""An engine's alert actions reach a real Alertmanager, are kept firing by re-sends, and are resolved."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from tests.harness.alertmanager import AlertmanagerProcess
from tests.support import eventually, xid_event
from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.http_settings import Listen
from watchd.integrations.alertmanager.settings import AlertmanagerConfig
from watchd.model.events import INGEST_PATH, batch_to_wire

RULES = """
rules:
  - name: EngineAlertTest
    severity: critical
    labels: {team: gpu-sre}
    match: {kind: xid, xid: 79}
    actions:
      - alert:
          summary: "Xid {{ xid }} on {{ node }}"
          description: "GPU {{ pci_bus_id }}: {{ meaning }}"
          resolve_after: 3s
"""


async def post_xid(engine: Engine, node: str, event_id: str) -> None:
    body = json.dumps(batch_to_wire(node, [xid_event(node, event_id=event_id)]))
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{engine.port}{INGEST_PATH}", data=body) as r,
    ):
        assert r.status == 200


async def test_alert_fires_is_kept_and_resolves(alertmanager: AlertmanagerProcess, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    config = EngineConfig(
        listen=Listen(port=0),
        rules=[rules],
        default_rules=False,
        mode="enforce",
        slurm={"enabled": False},
        external_url="http://watchd.example:9120",
        alertmanager=AlertmanagerConfig(urls=[alertmanager.url], resend_interval_s=1),
    )
    resolved_before = alertmanager.metric(
        "alertmanager_alerts_received_total", {"status": "resolved", "version": "v2"}
    )
    async with Engine(config) as engine:
        await post_xid(engine, "gpu-9", "am-1")
        await eventually(
            lambda: alertmanager.alert("EngineAlertTest") is not None, what="alert in Alertmanager"
        )
        alert = alertmanager.alert("EngineAlertTest")
        assert alert is not None
        assert alert["labels"] == {
            "alertname": "EngineAlertTest",
            "severity": "critical",
            "node": "gpu-9",
            "team": "gpu-sre",
        }
        assert alert["annotations"]["summary"] == "Xid 79 on gpu-9"
        assert alert["generatorURL"] == "http://watchd.example:9120/api/v1/status?node=gpu-9"
        first_ends = alert["endsAt"]
        await eventually(
            lambda: (alertmanager.alert("EngineAlertTest") or {}).get("endsAt") != first_ends,
            what="a re-send moving endsAt",
        )
        await eventually(lambda: alertmanager.alert("EngineAlertTest") is None, timeout=10, what="resolution")
        resolved = alertmanager.metric(
            "alertmanager_alerts_received_total", {"status": "resolved", "version": "v2"}
        )
        assert resolved > resolved_before
        assert [a.outcome for a in engine.audit.entries if a.action == "alert"] == ["fired"]


async def test_a_restarted_engine_keeps_its_alerts_firing(
    alertmanager: AlertmanagerProcess, tmp_path: Path
) -> None:
    """The firing alerts are in the state database: after a restart they are re-sent (their pages do not
    expire while the engine is back and the fault is still there) and resolve on their original schedule."""
    import time

    rules = tmp_path / "rules.yaml"
    rules.write_text(
        RULES.replace("resolve_after: 3s", "resolve_after: 6s").replace("EngineAlertTest", "RestartAlertTest")
    )
    config = EngineConfig(
        listen=Listen(port=0),
        rules=[rules],
        default_rules=False,
        mode="enforce",
        slurm={"enabled": False},
        state={"path": str(tmp_path / "state.db")},
        alertmanager=AlertmanagerConfig(urls=[alertmanager.url], resend_interval_s=1),
    )
    async with Engine(config) as engine:
        await post_xid(engine, "gpu-8", "am-restart")
        await eventually(
            lambda: alertmanager.alert("RestartAlertTest") is not None, what="alert in Alertmanager"
        )
        fired_at = time.monotonic()
    async with Engine(config) as engine:  # a new process would do the same: nothing is carried in memory
        assert engine.alerts is not None and len(engine.alerts.firing_keys) == 1
        first_ends = alertmanager.alert("RestartAlertTest")["endsAt"]  # type: ignore[index]
        await eventually(
            lambda: (alertmanager.alert("RestartAlertTest") or {}).get("endsAt") != first_ends,
            what="the restarted engine re-sending the alert",
        )
        await eventually(
            lambda: alertmanager.alert("RestartAlertTest") is None, timeout=15, what="resolution"
        )
        assert time.monotonic() - fired_at >= 5.0  # on its schedule: 6 s after it fired, not at the restart
        assert engine.alerts.firing_keys == [] and engine.store.alerts.list() == []
