"""A drain is planned once, by the drain batcher (which nodes to leave, which to drain with which reason):
the scheduler drains what was planned; a routed one, on the merged states, each of the node's schedulers
draining it where it is missing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pytest

from watchd.actions import drain_batcher
from watchd.actions.drain_batcher import DrainBatcher
from watchd.actions.outcome import Outcome
from watchd.integrations import base
from watchd.integrations.fake import scheduler as fake_scheduler
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.integrations.routing import scheduler as routing
from watchd.integrations.routing.scheduler import Route, RoutedScheduler
from watchd.model import nodes


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Every call of plan_drain, wherever it is made: the nodes it planned."""
    made: list[tuple[str, ...]] = []
    real: Callable[..., Any] = nodes.plan_drain

    def counted(reasons: Mapping[str, str], *args: Any) -> Any:
        made.append(tuple(sorted(reasons)))
        return real(reasons, *args)

    for module in (nodes, drain_batcher, base, fake_scheduler, routing):
        monkeypatch.setattr(module, "plan_drain", counted, raising=False)
    return made


async def drain_all(batcher: DrainBatcher, names: list[str]) -> list[Outcome]:
    batcher.start()
    try:
        results = await asyncio.gather(*(batcher.drain(n, "Xid 79") for n in names))
    finally:
        await batcher.stop()
    return [r.outcome for r in results]


async def test_a_round_of_drains_is_planned_once(plans: list[tuple[str, ...]]) -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2"])
    assert await drain_all(DrainBatcher(fake), ["gpu-1"]) == [Outcome.DRAINED]
    assert plans == [("gpu-1",)]
    assert fake.nodes["gpu-1"].drained and fake.nodes["gpu-1"].reason == "watchd: Xid 79"


async def test_a_routed_drain_is_planned_once_and_goes_on_where_it_is_missing(
    plans: list[tuple[str, ...]],
) -> None:
    slurm, kube = FakeScheduler(name="slurm"), FakeScheduler(name="kubernetes")
    slurm.add_nodes(["dgx-1", "dgx-2"])
    kube.add_nodes(["dgx-1", "dgx-2"])
    slurm.nodes["dgx-2"] = replace(slurm.nodes["dgx-2"], flags=frozenset({"DRAIN"}), reason="watchd: Xid 48")
    routed = RoutedScheduler([Route(slurm, ("dgx-*",)), Route(kube, ("dgx-*",))])
    assert await drain_all(DrainBatcher(routed), ["dgx-1", "dgx-2"]) == [Outcome.DRAINED, Outcome.DRAINED]
    assert plans == [("dgx-1", "dgx-2")]  # on the merged states, once
    assert all(s.nodes[n].drained for s in (slurm, kube) for n in ("dgx-1", "dgx-2"))
    assert slurm.nodes["dgx-2"].reason == "watchd: Xid 48"  # where it was drained already: untouched
    assert slurm.calls_of("drain") == [{"dgx-1": "watchd: Xid 79"}]
