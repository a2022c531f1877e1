"""What an ingest reply waits for, and what it then reads.

A batch is answered once its last event has been evaluated and the decisions handed to the executor until
then have run far enough to be recorded (their first intent written, or run to their audit record) or to have
failed to be. It is refused (503, so the agent sends it again) only when a decision made on one of its own
events could not be recorded: the failure of any other write (the usage ledger's flush, another batch's
decision) refuses nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from watchd.model.events import Event

#: events whose decisions could not be recorded, kept until their batch's reply reads them; those no reply
#: reads (the engine's own events, a reply sent before) are dropped oldest first beyond this many
MAX_UNRECORDED = 4096


class BatchAcks:
    """``deciding``: the executor's decisions submitted and not yet recorded (or failed to be)."""

    def __init__(self, deciding: Callable[[], set[asyncio.Future[str | None]]]) -> None:
        self._deciding = deciding
        self._replies: dict[int, asyncio.Future[None]] = {}  # id(queued event) -> its batch's reply waits
        self._waiters: set[asyncio.Future[Any]] = set()
        self._unrecorded: dict[str, str] = {}  # event id -> why its decision was not recorded, oldest first

    def evaluated(self, event: Event) -> asyncio.Future[None]:
        """Done once ``event`` (queued) has been evaluated and the decisions handed to the executor until then
        have been recorded or failed to be."""
        fut = self._replies.get(id(event))  # the queue holds the event: its id is not reused meanwhile
        if fut is None:
            fut = self._replies[id(event)] = asyncio.get_running_loop().create_future()
        return fut

    def decided(self, event: Event, recorded: asyncio.Future[str | None]) -> None:
        """A decision made on ``event``; ``recorded`` says why it could not be recorded (None: it was)."""
        recorded.add_done_callback(lambda done: self._read(event.id, done))

    def settle(self, event: Event) -> None:
        """``event`` has been evaluated: its batch's reply waits for the decisions submitted so far."""
        if not self._replies:
            return
        fut = self._replies.pop(id(event), None)
        if fut is None or fut.done():
            return
        pending = self._deciding()
        if not pending:
            fut.set_result(None)
            return
        waiter = asyncio.ensure_future(asyncio.wait(pending))
        self._waiters.add(waiter)  # referenced until done (the loop keeps only weak references)
        waiter.add_done_callback(self._waiters.discard)
        waiter.add_done_callback(lambda _: None if fut.done() else fut.set_result(None))

    def unrecorded(self, events: Iterable[Event]) -> str | None:
        """Why a decision made on one of ``events`` could not be recorded (the first such; None when every
        one was); what it says is forgotten."""
        if not self._unrecorded:
            return None
        why: str | None = None
        for event in events:
            found = self._unrecorded.pop(event.id, None)
            if why is None:
                why = found
        return why

    def _read(self, event_id: str, recorded: asyncio.Future[str | None]) -> None:
        why = None if recorded.cancelled() else recorded.result()
        if why is None:
            return
        self._unrecorded[event_id] = why
        if len(self._unrecorded) > MAX_UNRECORDED:
            del self._unrecorded[next(iter(self._unrecorded))]
