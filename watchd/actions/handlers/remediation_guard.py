"""What ``reboot`` and ``gpu_reset`` ask before they remediate a node (docs/remediation.md): checks to
validate it after, the reason it is out for not replaced by the lemon rule, and at most ``max_per_node``
automatic remediations of the node in ``window``, reboots and resets together. A re-drive after a crash
finishes what was decided before: neither is asked again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import Field

from watchd.actions.audit import AuditRecord
from watchd.actions.handler import ActionParams, Handler
from watchd.actions.incidents import REMEDIATIONS
from watchd.actions.outcome import ActionResult, Outcome
from watchd.model.durations import Duration
from watchd.store import keys

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.rules.decision import PlannedAction

DEFAULT_WINDOW_S = 7 * 86400.0


class RemediationParams(ActionParams):
    """The limit of a remediation's parameters (reboot, gpu_reset)."""

    max_per_node: int = Field(
        3, ge=1, description="automatic remediations of one node in the window; beyond, left for a person"
    )
    window: Duration = Field(DEFAULT_WINDOW_S, description="the window max_per_node counts in, e.g. 7d")


class RemediationHandler(Handler):
    """What a remediation's handler is (reboot, gpu_reset): disruptive, only on a node its decision's drain
    took out (or watchd had taken out), one of a node in flight (the window's limit does the counting)."""

    disruptive = True
    follows_drain = True
    cooldown_s = 0.0

    def key(self, action: PlannedAction) -> str:
        return keys.action(self.kind, action.node)


@dataclass(frozen=True)
class RemediationGuard:
    remedy: str  # what the outcomes call it: "a reboot"
    not_done: str  # what they say of the node: "not rebooted"

    def unvalidated(self, runtime: Runtime) -> ActionResult | None:
        """``no_checks`` when nothing would validate the node after the remedy, else None."""
        if runtime.validation is None:
            return ActionResult(
                Outcome.NO_CHECKS, f"no checks to validate the node after {self.remedy}: {self.not_done}"
            )
        return None

    def left_for_a_person(self, attempt: Attempt, runtime: Runtime) -> ActionResult | None:
        """``left_for_a_person`` when the lemon rule replaced the node's reason or the node had its
        remediations in the window, else None."""
        params = attempt.action.params
        limit = int(params.get("max_per_node", 3))
        window = float(params.get("window", DEFAULT_WINDOW_S))
        records = runtime.audit.recent(1000, node=attempt.action.node) if runtime.audit is not None else []
        done = remediations(records, attempt.now - window)
        if not attempt.redrive and (replaced := reason_replaced(records)) is not None:
            return ActionResult(
                Outcome.LEFT_FOR_A_PERSON,
                f"taken out again by rule {replaced.rule} ({replaced.detail}): {self.remedy} does not answer "
                "it",
            )
        if done >= limit and not attempt.redrive:
            return ActionResult(
                Outcome.LEFT_FOR_A_PERSON,
                f"{done} automatic remediations in {window / 86400:g} d (at most {limit}): left for a person",
                {"remediations": done},
            )
        return None


def remediations(records: Sequence[AuditRecord], since: float) -> int:
    """The automatic remediations in ``records`` (a node's audit trail) done since ``since``."""
    return sum(
        1
        for rec in records
        if rec.time >= since and rec.mode == "enforce" and REMEDIATIONS.get(rec.action) == rec.outcome
    )


def reason_replaced(records: Sequence[AuditRecord], since: float = 0.0) -> AuditRecord | None:
    """The drain since ``since`` (and since the node was last back in service) that replaced the reason it
    was out for (the lemon-node rule's): a person's matter, not a reboot's."""
    found: AuditRecord | None = None
    for rec in records:
        if rec.mode != "enforce":
            continue
        if rec.outcome == "resumed":
            found = None
        elif rec.action == "drain" and rec.outcome == "drained" and rec.params.get("replace_reason"):
            found = rec if rec.time >= since else None
    return found
