"""The engine's evaluation queue, in two lanes: an event that can become an action first, the summary stream
after it.

At 100,000 GPUs the agents send 20,000 per-GPU window summaries a second, all within about two seconds of each
5 s window's end (their windows are aligned to the epoch). Behind such a burst an Xid waited for every summary
queued before it: seconds under load against milliseconds on an idle engine. :class:`IngestQueue` is an
:class:`asyncio.Queue` (one bound over both lanes, ``join``/``task_done`` as before) whose ``get`` serves what
is not a summary first. One node's events keep their order but for one case: an event of a node with a summary
still queued waits in the summary lane behind it (a summary after a gpu_lost says the GPU is back; a health
event's order against the windows matters to the detectors), except an Xid of a later batch, which overtakes
its own node's earlier summaries too: it takes its job from its GPU's last evaluated summary (the job of a
window one or two earlier: the same but across a job change), and an Xid in the same batch as a summary stays
behind it (the agent sends them in the order it saw them).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator

from watchd.model.events import Event
from watchd.model.gpu import SUMMARY_KIND
from watchd.model.xid import KIND as XID_KIND

Accepted = tuple[Event, float]  # the event and its arrival time (monotonic)

#: the kinds served after the others: the summary stream, most of what a fleet sends and matched by no rule
BULK_KINDS = frozenset({SUMMARY_KIND})
#: the kinds that overtake even their own node's summaries of earlier batches
JUMPING_KINDS = frozenset({XID_KIND})


class _Lanes:
    """The deque :class:`asyncio.Queue` keeps, as two: ``append`` sorts, ``popleft`` serves urgent first."""

    __slots__ = ("bulk", "bulk_of", "urgent")

    def __init__(self) -> None:
        self.urgent: deque[Accepted] = deque()
        self.bulk: deque[Accepted] = deque()
        # node -> (its events in the bulk lane, the arrival time of the last: one batch shares one)
        self.bulk_of: dict[str, tuple[int, float]] = {}

    def append(self, item: Accepted) -> None:
        event, arrived = item
        node, kind = event.node, event.kind
        queued = self.bulk_of.get(node)
        if kind in BULK_KINDS or (queued is not None and (kind not in JUMPING_KINDS or queued[1] == arrived)):
            self.bulk.append(item)
            self.bulk_of[node] = (queued[0] + 1 if queued is not None else 1, arrived)
        else:
            self.urgent.append(item)

    def popleft(self) -> Accepted:
        if self.urgent:
            return self.urgent.popleft()
        item = self.bulk.popleft()
        node = item[0].node
        left, last = self.bulk_of[node]
        if left > 1:
            self.bulk_of[node] = (left - 1, last)
        else:
            del self.bulk_of[node]
        return item

    def __len__(self) -> int:
        return len(self.urgent) + len(self.bulk)

    def __bool__(self) -> bool:
        return bool(self.urgent) or bool(self.bulk)

    def __iter__(self) -> Iterator[Accepted]:
        yield from self.urgent
        yield from self.bulk


class IngestQueue(asyncio.Queue[Accepted]):
    """The engine's queue of accepted events: events other than summaries are served first."""

    def _init(self, maxsize: int) -> None:
        self._queue = _Lanes()

    def urgent(self) -> int:
        """Events waiting in the first lane."""
        return len(self._queue.urgent)


__all__ = ["BULK_KINDS", "JUMPING_KINDS", "Accepted", "IngestQueue"]
