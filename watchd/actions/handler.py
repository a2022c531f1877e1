"""What one kind of action is: its parameters, how the pipeline treats it, and how it runs; and the attempt
of one action on its way through the pipeline.

Every kind is one module in :mod:`watchd.actions.handlers` that exports ``HANDLER``; the rule schema, the
safety limits and the executor's pipeline all read what it says here, so a new action is that one module
(and its documentation)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from watchd.actions.outcome import ActionResult, Outcome
from watchd.strict import Strict

if TYPE_CHECKING:
    from watchd.actions.runtime import Runtime
    from watchd.actions.safety import SafetyGate
    from watchd.rules.decision import Decision, PlannedAction


class ActionParams(Strict):
    """The parameters of an action in a rule file: strict (a misspelt name is an error) and frozen."""


class ActionHandler(Protocol):
    #: The action's name in rule files (``- drain: {...}``), the audit trail and the metrics.
    kind: str
    #: Its parameters as the rule file gives them (templates rendered per event before it runs).
    params: type[ActionParams]
    #: Takes capacity away (counted by the rule's rate limit and the blast-radius breaker, held beyond).
    disruptive: bool
    #: Touches something outside watchd (a scheduler, Alertmanager, a URL): only the leader may do it.
    side_effect: bool
    #: Takes its node out of service: a requeue later in the same decision follows its outcome.
    takes_node_out: bool
    #: Acts on what a drain earlier in its decision left: skipped when the drain did not take the node out.
    follows_drain: bool
    #: Asks the safety gate itself, at the last moment (the drain round), instead of before it runs.
    gate_at_dispatch: bool
    #: Its own cooldown per key (seconds), instead of the engine's ``actions.cooldown_s``; 0: only one in
    #: flight per key.
    cooldown_s: float | None
    #: Written in rule files (the rule schema offers it); False for what only the engine or an operator
    #: starts (the hot spares, validation).
    rule_action: bool

    def key(self, action: PlannedAction) -> str | None:
        """Its de-duplication key (one intent in flight and one cooldown per key); None: never
        de-duplicated (every decision runs it)."""
        ...

    def describe(self, action: PlannedAction) -> str | None:
        """What dry-run records instead of running it; None: it touches no node and runs in dry-run too."""
        ...

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        """Carry it out (past de-duplication, mode, leadership and safety)."""
        ...

    def follow_ups(self, attempt: Attempt, result: ActionResult) -> Sequence[PlannedAction]:
        """The actions its outcome calls for next (a requeue: release a hot spare for the requeued jobs),
        each run through the whole pipeline after it has been recorded."""
        ...

    def applies(self, runtime: Runtime) -> bool:
        """Whether this engine does this kind at all (a follow-up that does not apply is not proposed)."""
        ...


class Handler:
    """Defaults for a handler: harmless, not de-duplicated, run in dry-run too."""

    kind: ClassVar[str]
    params: ClassVar[type[ActionParams]]
    disruptive: ClassVar[bool] = False
    side_effect: ClassVar[bool] = True
    takes_node_out: ClassVar[bool] = False
    follows_drain: ClassVar[bool] = False
    gate_at_dispatch: ClassVar[bool] = False
    cooldown_s: ClassVar[float | None] = None
    rule_action: ClassVar[bool] = True

    def key(self, action: PlannedAction) -> str | None:
        return None

    def describe(self, action: PlannedAction) -> str | None:
        return None

    def follow_ups(self, attempt: Attempt, result: ActionResult) -> Sequence[PlannedAction]:
        return ()

    def applies(self, runtime: Runtime) -> bool:
        return True


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
    #: Called when its intent, or its audit record, could not be written: unless its decision counted as
    #: recorded before, its batch is refused (the agent sends it again); it is told why.
    on_unrecorded: Callable[[str], None] | None = None
    #: Said before the outcome's detail in the audit trail: who asked ("by alice", "released by bob") or
    #: why it runs again ("re-driven after a restart").
    note: str = ""
    #: Driven again from its unfinished intent after a crash (or by the leader that took over): a handler
    #: whose steps are not idempotent finds out what the interrupted run left and finishes or undoes it.
    redrive: bool = False
