"""The engine's evaluation queue serves an Xid (anything but a summary) before the summaries of other nodes
queued earlier, under one bound (issue 35: an Xid behind a 100,000-GPU fleet's summary burst); one node's
events keep their order."""

from __future__ import annotations

import asyncio

import pytest

from watchd.engine.lanes import IngestQueue
from watchd.model.events import Event


def _ev(i: int, kind: str, node: str = "n1") -> Event:
    return Event(f"e{i}", node, "nvml", kind, 100.0, {})


async def test_urgent_before_bulk_each_in_order() -> None:
    q = IngestQueue(maxsize=5)
    sent = [("gpu_summary", "n1"), ("gpu_summary", "n2"), ("xid", "n3"), ("gpu_summary", "n3"), ("xid", "n4")]
    for i, (kind, node) in enumerate(sent):
        q.put_nowait((_ev(i, kind, node), 0.0))
    assert q.full() and q.qsize() == 5 and q.urgent() == 2
    with pytest.raises(asyncio.QueueFull):
        q.put_nowait((_ev(9, "xid"), 0.0))
    got = [(await q.get())[0].id for _ in range(5)]
    assert got == ["e2", "e4", "e0", "e1", "e3"]
    assert q.empty()
    for _ in got:
        q.task_done()
    await asyncio.wait_for(q.join(), 1)


async def test_one_nodes_events_keep_their_order() -> None:
    q = IngestQueue()
    for i, (kind, node) in enumerate([("gpu_summary", "a"), ("xid", "b"), ("xid", "a"), ("gpu_health", "a")]):
        q.put_nowait((_ev(i, kind, node), 0.0))
    assert q.urgent() == 1  # b's Xid; a's wait behind a's summary
    assert [(await q.get())[0].id for _ in range(4)] == ["e1", "e0", "e2", "e3"]
    q.put_nowait((_ev(9, "xid", "a"), 0.0))  # a has nothing queued any more: first lane
    assert q.urgent() == 1
