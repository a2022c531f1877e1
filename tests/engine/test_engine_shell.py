"""The engine as a service shell: an inert constructor, an explicit start and a cleanup in reverse order,
the leadership it owns, its periodic jobs on APScheduler, and its status read model."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest
import yaml

from tests.harness.kube_api import KubeApiServer
from watchd.config import EngineConfig, ReloadConfig
from watchd.engine.runner import Engine
from watchd.errors import ConfigError
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.integrations.kubernetes.lease import LeaseElector
from watchd.integrations.leadership import AlwaysLeader
from watchd.model.events import Event, Scalar
from watchd.periodic import Periodic
from watchd.store.settings import StateConfig


def config(tmp_path: Path, **more: object) -> EngineConfig:
    return EngineConfig.model_validate(
        {
            "listen": {"port": 0},
            "slurm": {"enabled": False},
            "state": {"path": str(tmp_path / "state" / "watchd.db")},
            **more,
        }
    )


def test_the_constructor_is_inert(tmp_path: Path) -> None:
    """No loop, no file, no rule, no token read: a broken config surfaces at start, not in the constructor."""
    broken = config(
        tmp_path,
        rules=[str(tmp_path / "missing-rules")],
        auth={"token_file": str(tmp_path / "missing-token")},
    )
    engine = Engine(broken)  # no running event loop either
    assert not (tmp_path / "state").exists()
    assert engine.port == 0 and engine.periodic.jobs() == {}
    assert not hasattr(engine, "store") and not hasattr(engine, "rules")


async def test_a_failed_start_raises_and_undoes_what_it_did(tmp_path: Path) -> None:
    engine = Engine(config(tmp_path, rules=[str(tmp_path / "missing-rules")]))
    with pytest.raises(ConfigError, match="missing-rules"):
        await engine.start()
    await engine.cleanup()  # nothing left to undo: a no-op
    engine = Engine(config(tmp_path, auth={"token_file": str(tmp_path / "missing-token")}))
    with pytest.raises(ConfigError, match=r"auth\.token_file"):
        async with engine:
            raise AssertionError("not reached")


async def test_start_then_cleanup_in_reverse_order(tmp_path: Path) -> None:
    cfg = config(tmp_path, mode="enforce", reload=ReloadConfig(poll_interval_s=0.5))
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    engine = Engine(cfg, scheduler=fake)
    await engine.start()
    try:
        assert (tmp_path / "state" / "watchd.db").exists()
        assert engine.rules.names and engine.scheduler is fake
        assert isinstance(engine.leadership, AlwaysLeader) and engine.ready() == (True, "ok")
        # the same intervals as the hand-written loops had (rules-watch only with rule files given)
        assert engine.periodic.jobs() == {
            "pools": cfg.safety.pools_refresh_s,
            "prune": 3600.0,
            "rule-state": cfg.state.rules_snapshot_s,
            "jobs": cfg.jobs.refresh_s,
            "detectors": cfg.detectors.interval_s,
            "detectors-watch": cfg.detectors.watch_interval_s,  # jobs whose GPUs spin (issue 35)
            "fleet-prune": 60.0,
            "store-probe": 2.0,  # the state database's write probe (issue 16 item 3)
            "reliability-flush": cfg.reliability.flush_s,  # issue 17
            "reliability": cfg.reliability.interval_s,
            "drains": cfg.drains.poll_s,  # the whole fleet's drains and the spares (issue 17)
            "usage-flush": 30.0,  # the usage report's observations to the state (issue 18)
            "usage-prune": 3600.0,
            "reboot-watch": cfg.remediation.poll_s,  # the reboots watchd asked for, until each node is back
            "marks-refresh": 10.0,  # the nodes' open marks (lemons, left for a person)
            "heap-freeze": 2.0,  # the collector's policy: what lives frozen (engine/heap.py)
        }
        with pytest.raises(RuntimeError, match="already started"):
            await engine.start()
    finally:
        started = time.monotonic()
        await engine.cleanup()
    assert time.monotonic() - started < 5
    assert engine._processor is None
    with pytest.raises(Exception, match="closed"):
        engine.store.held.list()  # the state is closed last


async def test_status_document_has_the_same_shape(tmp_path: Path) -> None:
    async with Engine(config(tmp_path), scheduler=FakeScheduler()) as engine:
        doc = engine.status()
    assert set(doc) == {
        "reliability",  # issue 17
        "marks",  # the marked nodes
        "mode",
        "pid",
        "nodes",
        "rules",
        "queue_depth",
        "scheduler",
        "incidents",
        "recent_actions",
        "held",
        "jobs",
        "findings",
        "breaker",
        "alerts",
        # added by issue 16 item 6 (bounded document): the counts of what is left out, fleet evictions
        "nodes_total",
        "nodes_omitted",
        "held_total",
        "held_omitted",
        "fleet",
        "drains",  # issue 17: nodes out of service by owner class, spares
        "remediation",  # the reboots awaited
        "agent_commands",  # the commands waiting for their agents (GPU resets)
    }
    assert doc["scheduler"] == "fake" and doc["mode"] == "dry-run" and doc["alerts"] == []
    assert doc["breaker"] == [{"pool": "all", "size": 0, "taken_out": [], "taken_out_count": 0, "limit": 1}]
    assert doc["nodes_total"] == doc["nodes_omitted"] == doc["held_total"] == doc["held_omitted"] == 0
    assert doc["fleet"] == {
        "evicted": {"node": 0, "gpu": 0},
        "state_bytes": 0,
        "max_state_bytes": 2048 * 1024 * 1024,
    }


async def test_status_document_is_bounded_troubled_nodes_first_and_pages(tmp_path: Path) -> None:
    async with Engine(config(tmp_path), scheduler=FakeScheduler()) as engine:
        fleet = engine.correlator.fleet
        for i in range(30):
            fleet.observe(_summary_event(f"n{i:02d}", 0, 100.0 + i))
        fleet.observe(_lost_event("n29", 3, 200.0))
        doc = engine.status({"limit": "5"})
        assert doc["nodes_total"] == 30 and doc["nodes_omitted"] == 25 and len(doc["nodes"]) == 5
        assert doc["nodes"][0]["node"] == "n29" and doc["nodes"][0]["lost_gpus"] == [3]  # troubled first
        assert [n["node"] for n in doc["nodes"][1:]] == ["n00", "n01", "n02", "n03"]
        only = engine.status({"node": "n07"})
        assert [n["node"] for n in only["nodes"]] == ["n07"] and only["nodes_total"] == 1
        prefix = engine.status({"node": "n1*", "limit": "100"})
        assert [n["node"] for n in prefix["nodes"]] == [f"n1{i}" for i in range(10)]
        assert len(engine.status()["nodes"]) == 30  # under the default limit: all of them
        with pytest.raises(ValueError, match="limit"):
            engine.status({"limit": "-1"})
        with pytest.raises(ValueError, match="held_limit"):
            engine.status({"held_limit": "many"})


def _summary_event(node: str, gpu: int, at: float) -> Event:
    attrs: dict[str, Scalar] = {"gpu": gpu, "util_mean": 99.0, "power_mean": 650.0, "window_s": 5}
    return Event(
        id=f"s-{node}-{gpu}-{at}", node=node, source="nvml", kind="gpu_summary", time=at, attrs=attrs
    )


def _lost_event(node: str, gpu: int, at: float) -> Event:
    attrs: dict[str, Scalar] = {
        "condition": "gpu_lost",
        "gpu": gpu,
        "value": 1,
        "evidence": "NVML: GPU is lost",
    }
    return Event(id=f"l-{node}-{gpu}-{at}", node=node, source="nvml", kind="gpu_health", time=at, attrs=attrs)


async def test_the_engine_owns_the_elected_leadership(tmp_path: Path) -> None:
    async with KubeApiServer() as api:
        kc = tmp_path / "kubeconfig"
        kc.write_text(yaml.safe_dump(api.kubeconfig()))
        election = {
            "enabled": True,
            "identity": "engine-a",
            "lease_duration_s": 2,
            "renew_deadline_s": 1.5,
            "retry_period_s": 0.2,
        }
        cfg = config(
            tmp_path, kubernetes={"enabled": True, "kubeconfig": str(kc), "leader_election": election}
        )
        engine = Engine(cfg)
        assert isinstance(engine.leadership, AlwaysLeader)  # nothing built before start
        async with engine:
            elector = engine.leadership
            assert isinstance(elector, LeaseElector) and elector.takeover_wait_s == 2 * 2 + 2 * 0.2
            assert engine.executor.leader_gate.leadership is elector  # every side effect asks it
            assert await elector.wait_leader(3)
            assert engine.ready() == (True, "leader")
            assert api.state.leases[("watchd", "watchd-engine")]["spec"]["holderIdentity"] == "engine-a"
        # the clean stop handed the Lease over
        assert api.state.leases[("watchd", "watchd-engine")]["spec"]["holderIdentity"] == ""
        assert not elector.is_leader


# ------------------------------------------------------------------------------------------ periodic jobs


async def test_periodic_runs_each_job_alone_and_survives_a_failure() -> None:
    periodic = Periodic()
    runs: list[float] = []
    running = 0
    most = 0

    async def slow() -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        runs.append(time.monotonic())
        await asyncio.sleep(0.25)  # longer than the interval: runs never overlap
        running -= 1

    failures = 0

    async def broken() -> None:
        nonlocal failures
        failures += 1
        raise RuntimeError("a locked store")

    periodic.every(0.05, slow, "slow")
    periodic.every(0.05, broken, "broken")
    started = time.monotonic()
    periodic.start()
    await asyncio.sleep(0.7)
    await periodic.stop(timeout=1.0)
    assert time.monotonic() - started < 1.5  # the run in progress was cancelled, not awaited to its end
    assert most == 1 and 2 <= len(runs) <= 4
    assert runs[0] - started >= 0.04  # the first run one interval after the start
    assert failures >= 5  # a failing job keeps its schedule
    count = len(runs)
    await asyncio.sleep(0.2)
    assert len(runs) == count  # stopped


async def test_rule_state_snapshots_stretch_to_ten_times_a_slow_save(tmp_path: Path) -> None:
    cfg = config(tmp_path, state=StateConfig(path=tmp_path / "s.db", rules_snapshot_s=0.05))
    async with Engine(cfg, scheduler=FakeScheduler()) as engine:
        saves: list[float] = []
        store_save = engine.store.rule_state.save

        def slow_save(*args: object) -> None:
            saves.append(time.monotonic())
            time.sleep(0.05)  # a save that takes as long as the interval
            store_save(*args)  # type: ignore[arg-type]

        engine.store.rule_state.save = slow_save  # type: ignore[method-assign]
        engine.rule_keeper.saved = True  # a saved state must be replaced even when empty: every run saves
        await asyncio.sleep(1.3)
    gaps = [b - a for a, b in itertools.pairwise(saves)]
    assert saves and all(g >= 0.45 for g in gaps), gaps  # ~10 x 0.05 s between saves, not 0.05 s


async def test_fleet_evictions_are_counted_in_a_metric(tmp_path: Path) -> None:
    async with Engine(config(tmp_path), scheduler=FakeScheduler()) as engine:
        fleet = engine.correlator.fleet
        fleet.max_nodes = 2
        for i in range(5):
            fleet.observe(_summary_event(f"n{i}", 0, 100.0 + i))
        fleet.observe(_summary_event("n4", 999, 110.0))  # a GPU index past the bound: refused
        engine.detectors.count_evictions()
        engine.detectors.count_evictions()  # counted once
        value = engine.metrics.registry.get_sample_value
        assert value("watchd_fleet_evicted_total", {"what": "node"}) == 3
        assert value("watchd_fleet_evicted_total", {"what": "gpu"}) == 1
        assert sorted({n for n, _ in fleet.gpus}) == ["n3", "n4"]
        assert engine.status()["fleet"]["evicted"] == {"node": 3, "gpu": 1}
        assert value("watchd_fleet_state_bytes", {}) == fleet.bytes > 0


async def test_the_prune_job_drops_resolved_held_actions_and_finished_intents_past_retention(
    tmp_path: Path,
) -> None:
    from watchd.store.held import HeldAction

    async with Engine(config(tmp_path), scheduler=FakeScheduler()) as engine:
        store, now = engine.store, time.time()
        old = now - engine.config.state.audit_retention_days * 86400 - 10

        def held(node: str) -> int:
            return store.held.hold(HeldAction("r", "drain", node, "all", {}, {}, "breaker", old))

        resolved, recent, waiting = held("n1"), held("n2"), held("n3")
        store.held.discard(resolved, "ops", old)
        store.held.discard(recent, "ops", now)
        assert store.intents.begin("drain:n1", "drain", "n1", "r", "e1", {}, old, None)
        store.intents.finish("drain:n1", "drained", "", old)
        assert store.intents.begin("drain:n3", "drain", "n3", "r", "e3", {}, old, None)
        await engine._prune()
        assert store.held.get(resolved) is None and store.held.get(recent) is not None
        assert store.held.get(waiting) is not None  # still held: never pruned
        assert [i.key for i in store.intents.unfinished()] == ["drain:n3"]
        assert store.intents.last_finished("drain:n1") is None
