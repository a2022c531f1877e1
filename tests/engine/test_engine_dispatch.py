"""Events delivered by kind: each subsystem declares the kinds it takes and the engine's news it asks for, the
engine builds its tables once, and a subsystem is never called for a kind it did not ask for."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.action import ActionOutcome, NodeReturned
from watchd.model.events import Event
from watchd.model.gpu import SUMMARY_KIND
from watchd.model.registry import REPAIRED_KIND
from watchd.rules.decision import Decision
from watchd.store.held import HeldReleased
from watchd.subsystem import ANY, Component, Dispatch, Handler, Housekeeping, News


def event(kind: str, node: str = "n1") -> Event:
    return Event(id=f"{kind}-{node}", node=node, source="agent", kind=kind, time=100.0)


class Taker(Component):
    def __init__(self, name: str, kinds: tuple[str, ...], seen: list[tuple[str, str]]) -> None:
        self.name, self._kinds, self._seen = name, kinds, seen

    def subscriptions(self) -> Mapping[str, Handler]:
        return {kind: self._take for kind in self._kinds}

    def _take(self, e: Event) -> None:
        self._seen.append((self.name, e.kind))


def test_each_kind_goes_only_to_those_that_asked_for_it_in_their_order() -> None:
    seen: list[tuple[str, str]] = []
    xids = Taker("xids", ("xid",), seen)
    every = Taker("every", (ANY,), seen)
    both = Taker("both", ("xid", "heartbeat"), seen)
    dispatch = Dispatch.of([xids, every, both, Component()])
    for kind in ("xid", "heartbeat", "gpu_summary", "a_kind_nobody_named"):
        for handle in dispatch.handlers(kind):
            handle(event(kind))
    assert seen == [
        ("xids", "xid"),
        ("every", "xid"),
        ("both", "xid"),
        ("every", "heartbeat"),
        ("both", "heartbeat"),
        ("every", "gpu_summary"),
        ("every", "a_kind_nobody_named"),
    ]
    assert set(dispatch.table) == {"xid", "heartbeat"}  # built once, for the kinds named


def test_news_goes_by_type_to_those_that_asked_for_it() -> None:
    got: list[tuple[str, object]] = []

    class Listener(Component):
        def __init__(self, name: str, types: tuple[type, ...]) -> None:
            self.name, self._types = name, types

        def news(self) -> Mapping[type, Callable[[Any], None]]:
            return {t: (lambda item, name=self.name: got.append((name, item))) for t in self._types}

    news = News([Listener("a", (Housekeeping,)), Listener("b", (Housekeeping, NodeReturned)), Component()])
    news.publish(Housekeeping(5.0))
    news.publish(NodeReturned("n1", 6.0))
    news.publish("nobody asked for a str")
    assert got == [("a", Housekeeping(5.0)), ("b", Housekeeping(5.0)), ("b", NodeReturned("n1", 6.0))]


def test_no_subsystem_filters_the_stream_itself() -> None:
    """Every subsystem of the engine says what it takes in its subscriptions: none overrides ``observe``
    (the stream by hand, filtered by its own if-chain)."""
    import watchd.engine.runner  # noqa: F401  # every subsystem the engine composes is imported by now

    def subclasses(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *subclasses(sub))]

    found = [c for c in subclasses(Component) if c.__module__.startswith("watchd.")]
    assert len(found) >= 10
    assert [c.__qualname__ for c in found if c.observe is not Component.observe] == []


async def test_the_engine_builds_its_tables_from_the_subsystems(tmp_path: Path) -> None:
    """Reliability takes every kind (exposure) and the engine's news (no special case of it in the engine):
    its subscriptions are in the engine's tables, with the fleet state's for the GPU summaries."""
    config = EngineConfig.model_validate(
        {"listen": {"port": 0}, "slurm": {"enabled": False}, "state": {"path": str(tmp_path / "w.db")}}
    )
    async with Engine(config, scheduler=FakeScheduler()) as engine:
        reliability = engine.reliability
        summary = engine.dispatch.handlers(SUMMARY_KIND)
        assert reliability.subscriptions()[SUMMARY_KIND] in summary
        assert [h.__qualname__ for h in summary][:1] == ["FleetState._bounded.<locals>.bounded"]
        assert engine.dispatch.handlers("a_kind_nobody_named") == (reliability.subscriptions()[ANY],)
        assert reliability.subscriptions()[REPAIRED_KIND] in engine.dispatch.handlers(REPAIRED_KIND)
        for news in (Decision, ActionOutcome, NodeReturned, HeldReleased, Housekeeping):
            assert news in reliability.news()
        # a node back through watchd ends its failure: the news reaches reliability
        reliability.service.seen("n1", 50.0)
        reliability.service.failed("n1", 60.0)
        engine.news.publish(NodeReturned("n1", 70.0))
        assert reliability.service.nodes["n1"].out_since is None
