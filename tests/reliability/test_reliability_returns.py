"""Every way back to service ends a failure, and a drain the breaker held counts once it is released: a
validation that passed (the engine's ``validate``, as ``checks.auto_validate`` and ``watchd node validate``
run it), an operator's resume watchd never saw (the fleet listing at the next flush), and a released held
drain (from its release). Real state database (SQLite), fake clock."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from tests.reliability.test_reliability_feedback import drain, make, xid
from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.events import Event
from watchd.model.fleet import FleetNode
from watchd.reliability.returns import LISTING_MARGIN_S
from watchd.store.held import HeldAction

RULES = str(Path(__file__).resolve().parents[2] / "rules")


def node(name: str, **kw: object) -> FleetNode:
    return FleetNode(name, "slurm", ("batch",), **kw)  # type: ignore[arg-type]


def test_an_operators_resume_seen_in_the_fleet_listing_ends_the_failure() -> None:
    rel, store, _ = make()
    drain(rel, xid("n1", 1000.0), "drained")  # recorded at 1001
    drain(rel, xid("n2", 1000.0), "drained")
    drain(rel, xid("n3", 1000.0), "drained")
    listing = [
        node("n1"),  # resumed by hand (scontrol update State=RESUME)
        node("n2", flags=frozenset({"DRAIN"}), reason="watchd: Xid79"),  # still out
        node("n3", flags=frozenset({"MAINT"})),  # being validated: its drain lifted, not back yet
    ]
    seen = {"at": 1001.0 + LISTING_MARGIN_S - 1}
    rel.fleet_listing = lambda: (listing, seen["at"])
    assert rel.seen_back() == []  # a listing right after the drain may predate it: not trusted
    seen["at"] = 1100.0
    assert rel.seen_back() == ["n1"]
    failures = {f.node: f.back_at for f in store.reliability.failures(0.0)}
    assert failures == {"n1": 1100.0, "n2": None, "n3": None}
    rel.validating = lambda: {"n3"}
    listing[2] = node("n3", state="allocated")  # its check job runs in the reservation
    assert rel.seen_back() == []
    rel.validating = frozenset
    assert rel.seen_back() == ["n3"]  # validated and resumed
    assert rel.seen_back() == []  # once


def test_a_released_held_drain_is_a_failure_from_its_release() -> None:
    rel, store, _ = make()
    source = xid("n1", 1000.0)
    held = HeldAction(
        rule="xid-fatal-hardware",
        kind="drain",
        node="n1",
        pool="batch",
        params={"reason": "Xid79"},
        event=source.to_wire(),
        reason="blast-radius breaker",
        held_at=1000.0,
        id=7,
        status="released",
    )
    drain(rel, source, "held")  # held: no failure yet (the node still serves)
    assert store.reliability.failures(0.0) == []
    assert rel.released(held, "drained", 5000.0)
    [failure] = store.reliability.failures(0.0)
    assert (failure.time, failure.node, failure.evidence) == (5000.0, "n1", "xid 79 (RESTART_BM)")
    assert not rel.released(held, "drained", 5001.0)  # the same time out: one failure
    app = replace(held, node="n2", event=xid("n2", 10.0, 13, "RESTART_APP").to_wire())
    assert not rel.released(app, "drained", 5000.0)  # an application Xid: no hardware evidence
    assert not rel.released(replace(held, node="n3"), "held", 5000.0)


async def test_a_validation_that_passed_ends_the_failure(tmp_path: Path) -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2"])
    config = EngineConfig.model_validate(
        {
            "listen": {"port": 0},
            "auth": {"token": "t0ken"},
            "mode": "enforce",
            "slurm": {"enabled": False},
            "fake": {"enabled": True, "nodes": ["gpu-1", "gpu-2"]},
            "state": {"path": str(tmp_path / "state.db")},
            "checks": {
                "enabled": True,
                "runner": "fake",
                "items": [{"name": "nhc", "type": "command", "command": ["/bin/true"]}],
            },
        }
    )
    async with Engine(config, scheduler=fake) as engine:
        rel = engine.reliability
        source = xid("gpu-1", engine.clock.now() - 60)
        drain(rel, source, "drained")
        await fake.drain({"gpu-1": "watchd: Xid79 3b:00 GPU has fallen off the bus"})
        [failure] = engine.store.reliability.failures(0.0)
        assert failure.back_at is None
        result = await engine.validate("gpu-1", "auto: node_gpu_reset", None)
        assert result["outcome"] == "resumed", result
        [failure] = engine.store.reliability.failures(0.0)
        assert failure.back_at is not None  # back through its validation: no longer "still out"
        assert rel.service.nodes["gpu-1"].out_since is None


async def test_the_engines_release_of_a_held_drain_counts_one_failure_from_then(tmp_path: Path) -> None:
    nodes = [f"gpu-{i}" for i in range(1, 11)]
    fake = FakeScheduler()
    fake.add_nodes(nodes)
    config = EngineConfig.model_validate(
        {
            "listen": {"port": 0},
            "auth": {"token": "t0ken"},
            "mode": "enforce",
            "rules": [RULES],
            "slurm": {"enabled": False},
            "fake": {"enabled": True, "nodes": nodes},
            "state": {"path": str(tmp_path / "state.db")},
            "safety": {"max_fraction": 0.1},  # one node of ten
        }
    )
    async with Engine(config, scheduler=fake) as engine:
        now = engine.clock.now()
        for i, n in enumerate(("gpu-1", "gpu-2")):
            attrs = {"xid": 79, "bucket": "RESTART_BM", "pci_bus_id": "0000:3b:00.0", "gpu": 0}
            await engine.emit(Event(f"x{i}", n, "kmsg", "xid", now - 10 + i, attrs))  # type: ignore[arg-type]
        for _ in range(100):
            if engine.store.held.list():
                break
            await asyncio.sleep(0.05)
        (held,) = engine.store.held.list()
        assert held.node == "gpu-2" and not fake.nodes["gpu-2"].drained
        assert [f.node for f in engine.store.reliability.failures(0.0)] == ["gpu-1"]
        released_at = engine.clock.now()
        result = await engine.release(held.id, "alice")
        assert result["outcome"] == "drained", result
        failures = {f.node: f for f in engine.store.reliability.failures(0.0)}
        assert sorted(failures) == ["gpu-1", "gpu-2"]
        assert failures["gpu-2"].time >= released_at and failures["gpu-2"].rule == held.rule
