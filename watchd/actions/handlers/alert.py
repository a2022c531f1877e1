"""alert: fire an alert to Alertmanager, resolved after a while (re-fired after a restart)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.outcome import ActionResult, Outcome
from watchd.integrations.alerts import Alert
from watchd.model.durations import Duration
from watchd.store import keys

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime


class AlertParams(ActionParams):
    """Fire an alert to Alertmanager (labels: alertname=rule name, severity, node, the rule's labels)."""

    summary: str = Field("{{ rule }} on {{ node }}", description="template")
    description: str = Field("", description="template")
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels (templates)")
    resolve_after: Duration = Field(3600.0, description="resolved automatically after this long")


class AlertHandler(Handler):
    kind = "alert"
    params = AlertParams

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        if not runtime.alerts.enabled:
            return ActionResult(Outcome.NO_ALERTMANAGER, "no Alertmanager is configured")
        action, decision = attempt.action, attempt.decision
        assert decision is not None, "alerts come from rules"
        params = action.params
        labels = {
            "alertname": decision.rule,
            "severity": decision.severity,
            "node": action.node,
            **dict(decision.labels),
            **dict(params.get("labels") or {}),
        }
        base = runtime.generator_url
        alert = Alert(
            labels=labels,
            annotations={
                "summary": str(params.get("summary", "")),
                "description": str(params.get("description", "")),
            },
            generator_url=f"{base}/api/v1/status?node={action.node}" if base else "",
        )
        # Keyed by the group and the label set, as Alertmanager tells alerts apart: a second GPU's Xid on
        # the node (another pci_bus_id label) is a second page, not a replacement that resolves the first.
        group = "/".join(f"{v}" for v in decision.group.values())
        key = keys.rule_alert(decision.rule, group, dict(alert.labels))
        await runtime.alerts.fire(key, alert, float(params.get("resolve_after") or 3600.0))
        return ActionResult(Outcome.FIRED, f"{alert.name} {decision.rule}/{group}")


HANDLER = AlertHandler()
