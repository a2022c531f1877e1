"""The nodes' marks as the engine serves and follows them (:mod:`watchd.store.node_records`): a marked node
(a lemon, or left for a person) is neither remediated nor returned to service by watchd until the mark is
cleared, by an operator (``watchd node unmark NODE --why TEXT``: ``POST /api/v1/nodes/{node}/unmark``) or
because its agent reports a different GPU in the slot the mark was about (the hardware was replaced; a mark
about no one slot: in any slot). Either way the clearing is the ``unmark`` action, audited.

What is followed: the open marks (a few nodes; read again every ``REFRESH_S`` and after each clearing) and,
for them only, the GPUs each ``gpu_summary`` names per slot, remembered with the mark the first time a slot
is seen: a summary of an unmarked node costs one dictionary lookup."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge

from watchd.actions.executor import ActionExecutor
from watchd.actions.handlers.unmark import HANDLER as UNMARK
from watchd.actions.outcome import ActionResult
from watchd.clock import Clock
from watchd.httputil import BodyError, error_response, json_response, read_json
from watchd.logs import get_logger
from watchd.model.events import Event
from watchd.model.gpu import SUMMARY_KIND
from watchd.store.connection import StoreError
from watchd.store.node_records import MARKS, Mark, NodeRecords
from watchd.subsystem import Component, Handler, Job, Operator
from watchd.xid.pci import normalize_pci

__all__ = ["NodeMarks", "Unmark", "unmark_with"]

_log = get_logger("watchd.marks")

#: seconds between two reads of the open marks (a mark is set by an action; a GPU swap takes hours)
REFRESH_S = 10.0
_MAX_BODY = 4096
_MAX_WHY = 500

#: runs the ``unmark`` action through the executor: (node, params, who, event id) -> its result
Unmark = Callable[[str, dict[str, Any], str, str], Awaitable[ActionResult]]


def unmark_with(executor: ActionExecutor) -> Unmark:
    """The ``unmark`` action through ``executor``'s pipeline: an operator's (``who`` is "by NAME") or the
    engine's own (a marked GPU replaced), in enforce mode whatever the engine's (it changes only watchd's
    own record)."""

    async def unmark(node: str, params: dict[str, Any], who: str, event_id: str) -> ActionResult:
        rule = "operator" if who.startswith("by ") else "watchd"
        return await executor.act(
            UNMARK.kind, node, params, rule=rule, note=who, mode="enforce", event_id=event_id
        )

    return unmark


class NodeMarks(Component):
    name = "marks"

    def __init__(
        self,
        records: NodeRecords,
        unmark: Unmark,
        clock: Clock,
        leading: Callable[[], bool],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._records = records
        self._unmark = unmark
        self._clock = clock
        self._leading = leading
        self._open: dict[str, list[Mark]] = {}
        self._clearing: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()
        self.gauge = Gauge(
            "watchd_node_marks",
            "Nodes watchd keeps out of automatic remediation and service until the mark is cleared, by mark "
            "(lemon, left_for_a_person).",
            ["mark"],
            registry=registry,
        )

    async def start(self) -> None:
        self.refresh()

    async def stop(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def jobs(self) -> Sequence[Job]:
        async def refresh() -> None:
            self.refresh()

        return (Job("marks-refresh", REFRESH_S, refresh),)

    def refresh(self) -> None:
        try:
            marks = self._records.marked()
        except StoreError as exc:
            _log.warning("marks_unreadable", error=str(exc))
            return
        self._open = {}
        for m in marks:
            self._open.setdefault(m.node, []).append(m)
        for kind in MARKS:
            self.gauge.labels(kind).set(sum(1 for m in marks if m.mark == kind))

    # ------------------------------------------------------------------------- a GPU replaced

    def subscriptions(self) -> Mapping[str, Handler]:
        return {SUMMARY_KIND: self._summary}

    def _summary(self, event: Event) -> None:
        """A GPU's summary: the GPU seen in each slot of a marked node (a new one there clears the mark)."""
        marks = self._open.get(event.node)
        if marks is None:
            return
        slot = normalize_pci(str(event.attrs.get("pci_bus_id") or ""))
        uuid = str(event.attrs.get("uuid") or "")
        if not slot or not uuid:
            return
        for i, mark in enumerate(marks):
            seen = mark.gpus.get(slot)
            if seen is None:  # first sight of this slot since the mark: remembered with it
                try:
                    self._records.saw_gpus(mark.id, {slot: uuid})
                except StoreError as exc:
                    _log.warning("mark_gpus_unwritable", node=event.node, error=str(exc))
                    continue
                marks[i] = _with_gpu(mark, slot, uuid)
            elif seen != uuid and (not mark.gpu or normalize_pci(mark.gpu) == slot):
                self._replaced(event.node, mark, slot, seen, uuid)

    def _replaced(self, node: str, mark: Mark, slot: str, old: str, new: str) -> None:
        if node in self._clearing or not self._leading():
            return
        why = f"the GPU in {slot} was replaced ({old} -> {new})"
        _log.warning("marked_gpu_replaced", node=node, mark=mark.mark, slot=slot, old=old, new=new)
        self._clearing.add(node)
        event_id = f"gpu-replaced-{node}-{slot}-{new}"

        async def clear() -> None:
            try:
                await self._unmark(node, {"why": why}, "watchd", event_id)
            finally:
                self._clearing.discard(node)
                self.refresh()

        task = asyncio.ensure_future(clear())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------------- the operator's

    async def operator_unmark(self, node: str, why: str, mark: str, by: str) -> ActionResult:
        try:
            return await self._unmark(
                node,
                {"why": why, "mark": mark},
                f"by {by}",
                f"operator-unmark-{node}-{self._clock.now():.6f}",
            )
        finally:
            self.refresh()

    def routes(self, app: web.Application, operator: Operator) -> None:
        async def unmark(request: web.Request) -> web.Response:
            node = request.match_info["node"]
            if not node.isprintable():
                return error_response(400, "node: expected a printable name")
            try:
                body = await read_json(request, _MAX_BODY) if request.can_read_body else {}
            except BodyError as exc:
                return error_response(exc.status, exc.reason)
            except ValueError as exc:
                return error_response(400, str(exc))
            why, mark = (
                (body.get("why", ""), body.get("mark", "")) if isinstance(body, dict) else (None, None)
            )
            if not isinstance(why, str) or not why.strip() or len(why) > _MAX_WHY:
                return error_response(400, f"why: say why the mark is cleared (1-{_MAX_WHY} characters)")
            if not isinstance(mark, str) or (mark and mark not in MARKS):
                return error_response(400, f"mark: one of {', '.join(MARKS)}, or empty for every mark")
            result = await asyncio.shield(self.operator_unmark(node, why.strip(), mark, operator(request)))
            status = 200 if result.outcome in ("cleared", "not_marked") else 409
            return json_response(
                {"node": node, "outcome": result.outcome, "detail": result.detail}, status=status
            )

        async def node_marks(request: web.Request) -> web.Response:
            node = request.match_info["node"]
            history = self._records.history(node)
            return json_response(
                {
                    "node": node,
                    "open": [m.to_dict() for m in history if m.cleared_at is None],
                    "history": [m.to_dict() for m in history],
                }
            )

        async def all_marks(request: web.Request) -> web.Response:
            return json_response({"marks": [m.to_dict() for m in self._records.marked()]})

        app.router.add_post("/api/v1/nodes/{node}/unmark", unmark)
        app.router.add_get("/api/v1/nodes/{node}/marks", node_marks)
        app.router.add_get("/api/v1/marks", all_marks)

    def status(self) -> Mapping[str, Any]:
        return {"marked": {node: [m.mark for m in marks] for node, marks in sorted(self._open.items())}}


def _with_gpu(mark: Mark, slot: str, uuid: str) -> Mark:
    return replace(mark, gpus={**mark.gpus, slot: uuid})
