"""unmark: clear a node's marks (a lemon, or left for a person), so that watchd may remediate it and return
it to service again. Asked by an operator (``watchd node unmark``), or by the engine itself when the node's
agent reports a different GPU in the slot a mark was about (the hardware was replaced). Never a rule's
action: a plain ``scontrol update State=RESUME`` clears nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.outcome import ActionResult, Outcome
from watchd.store import keys
from watchd.store.node_records import MARKS, MarkKind

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.rules.decision import PlannedAction


class UnmarkParams(ActionParams):
    """Which marks to clear, and why (kept with the mark and in the audit trail)."""

    why: str = Field("", description="why the marks are cleared (e.g. the RMA ticket)")
    mark: str = Field("", description="lemon or left_for_a_person; empty: every mark of the node")


class UnmarkHandler(Handler):
    kind = "unmark"
    params = UnmarkParams
    rule_action = False
    cooldown_s = 0.0

    def key(self, action: PlannedAction) -> str:
        return keys.action(self.kind, action.node)

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        node, params = attempt.action.node, attempt.action.params
        if runtime.nodes is None:
            return ActionResult(Outcome.FAILED, "this engine keeps no node records")
        wanted = str(params.get("mark") or "")
        if wanted and wanted not in MARKS:
            return ActionResult(Outcome.FAILED, f"mark: {wanted!r} is not one of {', '.join(MARKS)}")
        kinds: tuple[MarkKind, ...] = tuple(m for m in MARKS if not wanted or m == wanted)
        why = str(params.get("why") or "")
        by = attempt.note.removeprefix("by ") or attempt.rule
        cleared = runtime.nodes.clear(node, by, why, attempt.now, kinds)
        if not cleared:
            return ActionResult(Outcome.NOT_MARKED, f"{node} carries no {wanted or 'mark'}")
        what = "; ".join(m.describe() for m in cleared)
        return ActionResult(
            Outcome.CLEARED,
            f"{what}: cleared{f' ({why})' if why else ''}",
            {"marks": [m.to_dict() for m in cleared]},
        )


HANDLER = UnmarkHandler()
