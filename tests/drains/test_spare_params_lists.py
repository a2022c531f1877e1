"""The spares' actions carry their lists as lists (the jobs a requeue took off a node, a pool's nodes), and
still read the comma-joined form of the intents and audit records written before."""

from __future__ import annotations

from watchd.actions.handler import Attempt
from watchd.actions.handlers.requeue import HANDLER as REQUEUE
from watchd.actions.handlers.spare import names
from watchd.actions.handlers.spare_release import HANDLER as SPARE_RELEASE
from watchd.actions.outcome import ActionResult, Outcome
from watchd.rules.decision import PlannedAction


def test_a_requeue_hands_its_jobs_on_as_a_list() -> None:
    action = PlannedAction(REQUEUE.kind, "gpu-1", {})
    attempt = Attempt(action, REQUEUE, "enforce", "rule", "event", 100.0)
    result = ActionResult(Outcome.REQUEUED, "requeued 100,101", {"requeued": ["100", "101"]})
    (follow,) = REQUEUE.follow_ups(attempt, result)
    assert follow.kind == SPARE_RELEASE.kind and follow.params == {"jobs": ["100", "101"]}


def test_a_list_parameter_reads_the_list_and_the_old_comma_form_alike() -> None:
    assert names(["7", "8"]) == names(("7", "8")) == names("7,8") == ["7", "8"]
    assert names("") == names(None) == names([]) == []
