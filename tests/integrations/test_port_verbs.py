"""A verb only one scheduler can do is one row in its own table and its method: asked through the port
(``ask``), gated like every change, routed only to the schedulers of a node that have it, and absent
(``Absent``, never a stub) where a scheduler lacks it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from watchd.integrations.base import SCHEDULER_VERBS
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.integrations.routing.scheduler import Route, RoutedScheduler
from watchd.port import Absent, Verb, VerbTable, ask, gated, table, verbs_of

WEIGH = Verb(
    "weigh",
    changes=True,
    capability="node weight",
    what=lambda node, weight: f"weight of {node}",
    refused=lambda why, node, weight: f"refused: {why}",
)


@dataclass(slots=True)
class Weighing(FakeScheduler):
    """A scheduler with a verb of its own: a node's weight."""

    verbs: ClassVar[VerbTable] = {**SCHEDULER_VERBS, **table(WEIGH)}

    async def weigh(self, node: str, weight: int) -> str:
        self.calls.append(("weigh", (node, weight)))
        return f"{node} weighs {weight}"


async def refuse(what: str) -> str:
    return f"{what}: not the leader"


async def test_a_verb_of_one_scheduler_is_asked_through_its_port() -> None:
    slurm = Weighing(name="slurm")
    assert await ask(slurm, "weigh", "gpu-1", 5) == "gpu-1 weighs 5"
    assert await ask(gated(slurm, verbs_of(slurm), refuse), "weigh", "gpu-1", 6) == (
        "refused: weight of gpu-1: not the leader"
    )
    assert slurm.calls == [("weigh", ("gpu-1", 5))]


async def test_a_scheduler_without_the_verb_has_it_absent() -> None:
    plain = FakeScheduler(name="kubernetes")
    assert "weigh" not in verbs_of(plain)
    with pytest.raises(Absent, match="kubernetes cannot weigh"):
        await ask(plain, "weigh", "gpu-1", 5)


async def test_a_routed_node_is_asked_of_its_schedulers_that_have_the_verb() -> None:
    slurm, kube = Weighing(name="slurm"), FakeScheduler(name="kubernetes")
    routed = RoutedScheduler([Route(slurm, ("hpc-*", "dgx-*")), Route(kube, ("k8s-*", "dgx-*"))])
    assert "weigh" in verbs_of(routed)
    assert await ask(routed, "weigh", "dgx-1", 3) == "dgx-1 weighs 3"
    with pytest.raises(Absent, match="no scheduler of k8s-1 can weigh"):
        await ask(routed, "weigh", "k8s-1", 3)
    assert slurm.calls == [("weigh", ("dgx-1", 3))] and kube.calls == []
    fenced = gated(routed, verbs_of(routed), refuse)
    assert (await ask(fenced, "weigh", "dgx-1", 4)).startswith("refused")
    assert slurm.calls == [("weigh", ("dgx-1", 3))]
