"""webhook: POST the decision as JSON to a URL (retried with backoff)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.outcome import ActionResult, Outcome

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime


class WebhookParams(ActionParams):
    """POST a JSON document (the decision) to a URL."""

    url: Annotated[str, Field(pattern=r"^https?://")]
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: Annotated[float, Field(gt=0)] = 5.0
    retries: Annotated[int, Field(ge=0, le=10)] = 3


class WebhookHandler(Handler):
    kind = "webhook"
    params = WebhookParams

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        if runtime.webhooks is None:
            return ActionResult(Outcome.FAILED, "webhooks are not available")
        action, decision = attempt.action, attempt.decision
        assert decision is not None, "webhooks come from rules"
        params = action.params
        payload = {
            "rule": decision.rule,
            "severity": decision.severity,
            "node": action.node,
            "mode": attempt.mode,
            "labels": dict(decision.labels),
            "group": dict(decision.group),
            "event": decision.event.to_wire(),
        }
        result = await runtime.webhooks.post(
            str(params["url"]),
            payload,
            headers=params.get("headers") or None,
            max_attempts=int(params.get("retries", 3)) + 1,
            timeout=float(params.get("timeout_s", 5)),
        )
        detail = f"HTTP {result.status} after {result.attempts} attempt(s) {result.error}".strip()
        return ActionResult(Outcome(result.outcome), detail)


HANDLER = WebhookHandler()
