"""One action on its way through the pipeline: what it is, where it comes from, and what the stages have
learnt about it so far."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from watchd.actions.outcome import Outcome

if TYPE_CHECKING:
    from watchd.actions.gates import SafetyGate
    from watchd.actions.handler import ActionHandler
    from watchd.rules.decision import Decision, PlannedAction

Mode = Literal["dry-run", "enforce"]


@dataclass(slots=True)
class Attempt:
    action: PlannedAction
    handler: ActionHandler
    mode: Mode
    #: The rule and event it comes from (for an operator's release: "operator" and the held action).
    rule: str
    event_id: str
    #: When it was decided; the intent, the breaker count and a hold are all dated by it.
    now: float
    #: Its parameters as the store and the audit trail keep them (JSON values).
    params: dict[str, Any] = field(default_factory=dict)
    decision: Decision | None = None
    #: False for what is counted but never held: an operator's release, a re-drive, a requeue after a drain.
    check_safety: bool = True
    #: A requeue comes later in its decision (kept with a held drain, so a release requeues too).
    requeue_follows: bool = False
    #: The outcome of the drain earlier in its decision, if any.
    after_drain: Outcome | None = None
    #: The safety check of a disruptive action, set by the safety stage.
    gate: SafetyGate | None = None
    #: Called once its intent is durable (before it waits for leadership or the scheduler): its decision
    #: counts as recorded from then on, and the ingest reply need not wait for the action itself.
    on_recorded: Callable[[], None] | None = None
    #: Said before the outcome's detail in the audit trail: who asked ("by alice", "released by bob") or
    #: why it runs again ("re-driven after a restart").
    note: str = ""
    #: Driven again from its unfinished intent after a crash (or by the leader that took over): a handler
    #: whose steps are not idempotent finds out what the interrupted run left and finishes or undoes it.
    redrive: bool = False
