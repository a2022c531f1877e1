"""What ``reboot`` and ``gpu_reset`` ask before they remediate a node (docs/remediation.md): checks to
validate it after, no mark on the node (the lemon rule's, or its remediations spent), and at most
``max_per_node`` automatic remediations of the node in ``window``, reboots and resets together. Both are
held in the node's record and claimed in one transaction, never counted from the audit trail; the marks are
asked again right before the cluster is touched. A re-drive after a crash finds its claim again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import Field

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.outcome import ActionResult, Outcome
from watchd.logs import get_logger
from watchd.model.durations import Duration
from watchd.store import keys
from watchd.store.connection import StoreError
from watchd.store.node_records import Claimed, Mark

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.rules.decision import PlannedAction

DEFAULT_WINDOW_S = 7 * 86400.0
_log = get_logger("watchd.actions.remediation")


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


@dataclass(frozen=True, slots=True)
class Claim:
    """A remediation claimed in the node's record: its id, and watchd's drain it was claimed under."""

    id: str
    generation: int


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

    def claim(self, attempt: Attempt, runtime: Runtime, key: str) -> Claim | ActionResult:
        """Claim the remediation in the node's record (:mod:`watchd.store.node_records`), in one
        transaction with the reads that allow it: its id, or ``left_for_a_person`` when the node is marked
        (a lemon, or its remediations spent) or had ``max_per_node`` remediations in ``window`` (which marks
        it). A re-drive of the same decision finds its claim again and is not counted twice."""
        node, params = attempt.action.node, attempt.action.params
        claim = claim_id(attempt, runtime, key)
        if runtime.nodes is None:
            return Claim(claim, 0)
        answer = runtime.nodes.claim(
            node,
            attempt.handler.kind,
            claim,
            attempt.rule,
            attempt.now,
            window_s=float(params.get("window", DEFAULT_WINDOW_S)),
            limit=int(params.get("max_per_node", 3)),
        )
        if isinstance(answer, Claimed):
            return Claim(claim, answer.generation)
        if answer.limit_reached:
            return ActionResult(
                Outcome.LEFT_FOR_A_PERSON,
                f"{answer.mark.detail}: {self.not_done}, left for a person (marked until an operator clears "
                f"it: watchd node unmark {node})",
                {"remediations": answer.count, "mark": answer.mark.mark},
            )
        return self.refused_by(answer.mark)

    def refused_by(self, mark: Mark) -> ActionResult:
        return ActionResult(
            Outcome.LEFT_FOR_A_PERSON,
            f"{mark.describe()}: {self.remedy} does not answer it, {self.not_done}",
            {"mark": mark.mark},
        )

    def still_unmarked(self, node: str, runtime: Runtime) -> ActionResult | None:
        """Asked again right before the cluster is touched (the wait for the node's jobs can be long): a
        mark set meanwhile (the lemon rule, following the same drain) stops the remedy."""
        marks = runtime.nodes.open_marks(node) if runtime.nodes is not None else []
        return self.refused_by(marks[0]) if marks else None

    def settle(self, runtime: Runtime, claim: Claim, result: ActionResult) -> None:
        """Keep the claim counted when the remedy was (or may have been) done; take it back when nothing
        was touched."""
        if runtime.nodes is None:
            return
        done = result.outcome in (Outcome.REBOOTING, Outcome.RESET)
        done = done or result.data.get("agent") in _MAY_HAVE_RUN
        try:
            runtime.nodes.settle(claim.id, result.outcome.value, done)
        except StoreError as exc:  # the claim stays counted: the safe side (one too many, never too few)
            _log.error(
                "remediation_not_settled", claim=claim.id, outcome=result.outcome.value, error=str(exc)
            )


#: what the agent may have done though the command did not end ``done``: failed while it ran, or no answer
_MAY_HAVE_RUN = frozenset({"failed", "unanswered"})


def claim_id(attempt: Attempt, runtime: Runtime, key: str) -> str:
    """The claim of one decision: its open intent's (the same for every re-drive of it)."""
    found = runtime.intents.under(key, limit=1) if runtime.intents is not None else []
    if found and found[-1].finished_at is None:
        return f"{key}#{found[-1].id}"
    return f"{key}@{attempt.event_id}@{attempt.now!r}"
