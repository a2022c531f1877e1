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
        q.put_nowait((_ev(i, kind, node), float(i)))
    assert q.full() and q.qsize() == 5 and q.urgent() == 2
    with pytest.raises(asyncio.QueueFull):
        q.put_nowait((_ev(9, "xid"), 0.0))
    got = [(await q.get())[0].id for _ in range(5)]
    assert got == ["e2", "e4", "e0", "e1", "e3"]
    assert q.empty()
    for _ in got:
        q.task_done()
    await asyncio.wait_for(q.join(), 1)


async def test_one_nodes_events_keep_their_order_but_a_later_xid() -> None:
    q = IngestQueue()
    sent = [("gpu_summary", "a", 1.0), ("xid", "b", 1.0), ("xid", "a", 1.0), ("gpu_health", "a", 2.0)]
    sent += [("xid", "a", 3.0)]  # a later batch's Xid overtakes a's earlier summary, not so its health event
    for i, (kind, node, arrived) in enumerate(sent):
        q.put_nowait((_ev(i, kind, node), arrived))
    assert q.urgent() == 2
    assert [(await q.get())[0].id for _ in range(5)] == ["e1", "e4", "e0", "e2", "e3"]
    q.put_nowait((_ev(9, "gpu_health", "a"), 4.0))  # a has nothing queued any more: first lane
    assert q.urgent() == 1
