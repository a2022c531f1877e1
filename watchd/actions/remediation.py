"""Remediation, one subsystem of the engine: the reboots and GPU resets watchd asked for, followed until each
node is back, and each node's incidents (``GET /api/v1/nodes/{node}/history``, read from the audit trail).

A ``reboot`` action that ended ``rebooting`` leaves its node here, with the boot it was asked in (its audit
record's result). Every ``remediation.poll_s`` the leader reads those nodes' states: a node with a new boot
and no reboot pending (and answering) is back, and the engine's rules hear ``node_rebooted`` (with
``checks.auto_validate: [node_rebooted, node_gpu_reset]``, the shipped default when checks are on, validation
starts; only a pass returns it to service). A node not back in ``remediation.return_timeout_s`` is reported
once (``node_reboot_overdue``). A ``gpu_reset`` action that ended ``reset`` (its agent reported the GPU reset)
is announced as ``node_gpu_reset`` as soon as its audit record is written (the executor's feedback), or at
the next poll. What is followed is read again from the audit trail at start, so a restart of the engine in
between neither forgets a node nor asks for its reboot again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from watchd.actions.audit import AuditRecord
from watchd.actions.incidents import incidents
from watchd.actions.runtime import AuditReader
from watchd.actions.settings import RemediationConfig
from watchd.clock import Clock
from watchd.httputil import error_response, json_response
from watchd.integrations.base import Scheduler, SchedulerError
from watchd.logs import get_logger
from watchd.model.action import KIND as FEEDBACK_KIND
from watchd.model.events import Event, stable_id
from watchd.model.nodes import describe
from watchd.model.reboot import SOURCE, NodeGpuReset, NodeRebooted, NodeRebootOverdue
from watchd.store.node_records import Mark
from watchd.subsystem import Component, Handler, Job, Operator

__all__ = ["Remediation", "awaiting_from"]

_log = get_logger("watchd.reboots")
#: how far back the trail is read at start for the reboots still awaited (one not back in a week was
#: reported overdue long ago; it stays out of service)
START_WINDOW_S = 7 * 86400.0
#: the audit records read at once (pages until the newest)
TRAIL_PAGE = 2000
#: the audit records of a node its history is read from
HISTORY_RECORDS = 5000
#: what ends the wait for a node besides its return: it was validated or resumed since
_SETTLED = {"validate", "resume"}


@dataclass(frozen=True, slots=True)
class Awaited:
    requested_at: float
    boot_id: str | None  # the boot the reboot was asked in
    overdue_sent: bool = False


@dataclass(frozen=True, slots=True)
class ResetDone:
    """A GPU reset the node's agent reported done, not yet announced."""

    requested_at: float
    done_at: float
    gpus: str
    command: str


def awaiting_from(
    records: Sequence[AuditRecord],
    into: dict[str, Awaited] | None = None,
    resets: dict[str, ResetDone] | None = None,
) -> dict[str, Awaited]:
    """The nodes whose last ``rebooting`` reboot was not followed by their validation or resume (``records``
    applied in time order to ``into``, or to nothing); and, into ``resets``, those whose last ``reset`` GPU
    reset was not."""
    out = {} if into is None else into
    done = {} if resets is None else resets
    for rec in sorted(records, key=lambda r: r.time):
        if rec.mode != "enforce":
            continue
        if rec.action == "reboot" and rec.outcome == "rebooting":
            boot = rec.result.get("boot_id")
            out[rec.node] = Awaited(float(rec.result.get("requested_at", rec.time)), boot and str(boot))
        elif rec.action == "gpu_reset" and rec.outcome == "reset":
            gpus = rec.result.get("gpus")
            done[rec.node] = ResetDone(
                float(rec.result.get("requested_at", rec.time)),
                rec.time,
                ",".join(str(g) for g in gpus) if isinstance(gpus, list) else str(gpus or ""),
                str(rec.result.get("command", "")),
            )
        elif rec.action in _SETTLED and rec.outcome != "deduplicated":
            out.pop(rec.node, None)
            done.pop(rec.node, None)
    return out


class Remediation(Component):
    name = "remediation"

    def __init__(
        self,
        scheduler: Scheduler | None,
        audit: AuditReader,
        config: RemediationConfig,
        clock: Clock,
        emit: Callable[[Event], Awaitable[None]],
        leading: Callable[[], bool],
        marks: Callable[[str], Sequence[Mark]] = lambda node: (),
    ) -> None:
        self._scheduler = scheduler
        self._marks = marks
        self._audit = audit
        self._config = config
        self._clock = clock
        self._emit = emit
        self._leading = leading
        self.awaited: dict[str, Awaited] = {}
        self.resets: dict[str, ResetDone] = {}
        self._read_until = 0.0  # the time of the newest audit record read
        self._background: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._read_until = self._clock.now() - START_WINDOW_S
        self._read_trail()
        if self.awaited:
            _log.info("reboots_awaited", nodes=sorted(self.awaited))
        if self.resets:
            _log.info("gpu_resets_to_announce", nodes=sorted(self.resets))

    async def stop(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def subscriptions(self) -> Mapping[str, Handler]:
        return {FEEDBACK_KIND: self._fed_back}

    def _fed_back(self, event: Event) -> None:
        """A GPU reset's outcome fed back by the executor: announced now rather than at the next poll."""
        if event.attrs.get("action") == "gpu_reset" and event.attrs.get("outcome") == "reset":
            task = asyncio.ensure_future(self.announce_resets())
            self._background.add(task)  # referenced until done (the loop keeps only weak references)
            task.add_done_callback(self._background.discard)

    def _read_trail(self) -> None:
        """The audit records since the last read, whoever wrote them (a rule's reboot, one driven again after
        a restart, an operator's resume), a page at a time: only what is new is read."""
        while records := self._audit.since(self._read_until, TRAIL_PAGE):
            awaiting_from(records, self.awaited, self.resets)
            self._read_until = records[-1].time
            if len(records) < TRAIL_PAGE:
                break

    def jobs(self) -> Sequence[Job]:
        return (Job("reboot-watch", self._config.poll_s, self.poll),) if self._scheduler is not None else ()

    async def poll(self) -> None:
        """Read the trail since the last poll, then the states of the nodes awaited (the leader only):
        each one back is announced once, each one overdue reported once."""
        await self.announce_resets()
        if not self.awaited or self._scheduler is None or not self._leading():
            return
        try:
            states = await self._scheduler.node_states(sorted(self.awaited))
        except SchedulerError as exc:
            _log.warning("reboot_watch_failed", error=str(exc))
            return
        now = self._clock.now()
        for node, awaited in list(self.awaited.items()):
            st = states.get(node)
            if st is None:
                continue
            after = round(now - awaited.requested_at, 3)
            if st.boot_id is not None and st.boot_id != awaited.boot_id and not st.reboot_pending:
                if "NOT_RESPONDING" in st.flags:
                    continue  # registered once, not answering now: not back yet
                del self.awaited[node]
                if marks := self._marks(node):  # e.g. a lemon: its rule paged; validation would not answer it
                    mark = marks[0]
                    _log.warning("node_rebooted_left_out", node=node, rule=mark.rule, reason=mark.detail)
                    continue
                _log.info("node_rebooted", node=node, after_s=after, boot_id=st.boot_id)
                back = NodeRebooted(requested_at=awaited.requested_at, after_s=after, boot_id=st.boot_id)
                await self._emit(
                    back.to_event(id=stable_id(node, "rebooted", st.boot_id), **self._at(node, now))
                )
            elif not awaited.overdue_sent and after > self._config.return_timeout_s:
                self.awaited[node] = Awaited(awaited.requested_at, awaited.boot_id, overdue_sent=True)
                _log.warning("node_reboot_overdue", node=node, after_s=after, state=describe(st))
                late = NodeRebootOverdue(requested_at=awaited.requested_at, after_s=after, state=describe(st))
                key = stable_id(node, "reboot_overdue", awaited.requested_at)
                await self._emit(late.to_event(id=key, **self._at(node, now)))

    async def announce_resets(self) -> None:
        """Read the trail since the last read; each GPU reset done and not yet announced is announced once
        (the leader only): ``node_gpu_reset``, which validates the node."""
        self._read_trail()
        if not self.resets or not self._leading():
            return
        now = self._clock.now()
        for node, done in list(self.resets.items()):
            del self.resets[node]
            if marks := self._marks(node):  # a lemon since: its rule paged; validation would not answer it
                _log.warning("node_gpu_reset_left_out", node=node, rule=marks[0].rule, reason=marks[0].detail)
                continue
            after = round(done.done_at - done.requested_at, 3)
            _log.info("node_gpu_reset", node=node, after_s=after, gpus=done.gpus, command=done.command)
            event = NodeGpuReset(
                requested_at=done.requested_at, after_s=after, gpus=done.gpus, command=done.command
            )
            key = stable_id(node, "gpu_reset", done.command, done.done_at)
            await self._emit(event.to_event(id=key, **self._at(node, now)))

    @staticmethod
    def _at(node: str, now: float) -> dict[str, Any]:
        return {"node": node, "source": SOURCE, "time": now}

    def history(self, node: str, limit: int) -> list[dict[str, Any]]:
        """The node's incidents, newest first, read from its last ``HISTORY_RECORDS`` audit records."""
        found = incidents(self._audit.recent(HISTORY_RECORDS, node=node))
        return [i.to_dict() for i in reversed(found[-limit:])]

    def routes(self, app: web.Application, operator: Operator) -> None:
        async def node_history(request: web.Request) -> web.Response:
            try:
                limit = min(1000, max(1, int(request.query.get("limit", "20"))))
            except ValueError:
                return error_response(400, "limit: expected an integer")
            node = request.match_info["node"]
            return json_response({"node": node, "incidents": self.history(node, limit)})

        app.router.add_get("/api/v1/nodes/{node}/history", node_history)

    def status(self) -> Mapping[str, Any]:
        return {
            "awaited": [
                {"node": n, "requested_at": a.requested_at, "overdue": a.overdue_sent}
                for n, a in sorted(self.awaited.items())
            ]
        }
