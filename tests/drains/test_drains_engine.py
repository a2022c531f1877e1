"""``watchd drains`` and the hot spares through a running engine, on the fake scheduler (Slurm's semantics):
the API and the CLI, the node_unavailable events, the metrics (promtool), and the loop an Xid starts:
drain, requeue, a spare released, the requeued job started on it, the pool topped up again."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.support import ScriptedLease, eventually, xid_event
from watchd.config import EngineConfig
from watchd.drains_cli import run_drains
from watchd.engine.runner import Engine
from watchd.fleetview.settings import DrainsConfig, SparesConfig
from watchd.http_settings import Listen
from watchd.integrations.fake.fleet import FakeFleet, fleet_of
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.unavailable import NodeUnavailable
from watchd.reach import connect
from watchd.store.held import HeldAction

RULES = Path(__file__).resolve().parents[2] / "rules"


def fleet() -> tuple[FakeScheduler, FakeFleet]:
    fake = FakeScheduler(partitions={"gpu": [f"gpu-{i}" for i in range(1, 7)], "cpu": ["cpu-1", "cpu-2"]})
    fake.add_nodes([*fake.partitions["gpu"], *fake.partitions["cpu"]])
    return fake, fleet_of(fake)


def config(mode: str = "enforce", spares: int = 1, **drains: float) -> EngineConfig:
    return EngineConfig(
        listen=Listen(port=0),
        mode=mode,  # type: ignore[arg-type]
        rules=[RULES],
        drains=DrainsConfig(poll_s=3600, **drains),
        spares=SparesConfig(partitions={"gpu": spares} if spares else {}),
    )


@pytest.fixture
async def running() -> AsyncIterator[tuple[Engine, FakeScheduler, FakeFleet]]:
    fake, fl = fleet()
    fake.add_job("100", ["gpu-2", "gpu-3"])  # running before the engine starts: gpu-1 is the first idle node
    fl.job_sizes["100"] = 2
    fake.add_job("200", ["gpu-4", "gpu-5", "gpu-6"])
    async with Engine(config(), scheduler=fake) as engine:
        yield engine, fake, fl


def audit_of(engine: Engine, action: str) -> list[dict[str, object]]:
    return [a for a in engine.recent_actions(1000) if a["action"] == action]


async def test_xid_drain_requeue_releases_the_spare_and_the_job_starts_on_it(
    running: tuple[Engine, FakeScheduler, FakeFleet],
) -> None:
    engine, fake, fl = running
    # the first poll (at start) took one idle node as the spare: gpu-1, the only idle one
    assert fl.reserved == {"gpu": ["gpu-1"]}
    assert fl.schedule() == []  # nothing pending yet
    engine.queue.put_nowait((xid_event("gpu-2", event_id="x1"), time.monotonic()))
    await eventually(lambda: fl.reserved.get("gpu") is None, what="the spare released")
    assert fake.jobs["100"].state == "pending" and fake.nodes["gpu-2"].reason
    [release] = audit_of(engine, "spare_release")
    assert release["outcome"] == "released" and release["rule"] == "xid-fatal-hardware"
    assert release["result"]["spare"] == "gpu-1" and release["result"]["jobs"] == ["100"]  # type: ignore[index]
    # a drains poll comes before Slurm lets the requeued job start (cred_expire): the pool is not topped up
    # from the spare released for it, nor from gpu-3, which it left and needs
    await engine.fleet.poll()
    assert fl.reserved == {} and ("pending", ("100",)) in fl.calls
    # slurmctld's next pass: the requeued job needs 2 nodes: gpu-3 (freed) and gpu-1 (the spare)
    assert fl.schedule() == ["100"]
    assert set(fake.jobs["100"].nodes) == {"gpu-1", "gpu-3"}
    assert [a["outcome"] for a in audit_of(engine, "spare")] == ["changed"]  # taken at start
    assert engine.fleet.document()["unavailable"][0]["watchd"]["requeued"] == ["100"]
    # nothing idle is left: no spare is taken from a running job
    await engine.fleet.poll()
    assert fl.reserved == {}
    # a node comes back: the pool is topped up from it
    fake.jobs["200"].state = "done"
    for n in ("gpu-4", "gpu-5", "gpu-6"):
        fake.nodes[n] = fake.add_node(n)
    await engine.fleet.poll()
    assert fl.reserved == {"gpu": ["gpu-4"]}  # one, as configured: never more


async def test_drains_api_and_cli_show_every_owner_class_with_watchd_evidence(
    running: tuple[Engine, FakeScheduler, FakeFleet],
) -> None:
    engine, fake, fl = running
    engine.queue.put_nowait((xid_event("gpu-2", event_id="x2"), time.monotonic()))
    await eventually(lambda: len(audit_of(engine, "requeue")) == 1, what="the requeue")
    fake.set_admin_drain("gpu-5", "swap DIMM B3")
    fake.set_admin_drain("gpu-6", "NHC: check_fs_mount: /scratch not mounted")
    fake.set_down("cpu-1", "Not responding")
    fake.add_node("cpu-2", state="down")  # down, no reason, not flagged by the scheduler: "other"
    fl.since["gpu-5"] = time.time() - 7200
    held = HeldAction("lemon-node", "drain", "gpu-2", "gpu", {}, {}, "breaker open: 3/1 of gpu", time.time())
    engine.store.held.hold(held)
    url = f"http://127.0.0.1:{engine.port}"
    out = io.StringIO()
    assert await asyncio.to_thread(run_drains, connect(url), True, True, None, out) == 0
    doc = json.loads(out.getvalue())
    rows = {r["node"]: r for r in doc["unavailable"]}
    assert {n: r["owner"] for n, r in rows.items()} == {
        "gpu-5": "admin",
        "gpu-2": "watchd",
        "gpu-6": "nhc",
        "cpu-1": "scheduler",
        "cpu-2": "other",
    }
    assert next(iter(rows)) == "gpu-5"  # the oldest first
    assert 7100 < rows["gpu-5"]["age_s"] < 7300
    watchd = rows["gpu-2"]["watchd"]
    assert watchd["rule"] == "xid-fatal-hardware" and watchd["requeued"] == ["100"]
    assert "Xid79 3b:00" in watchd["evidence"]
    assert [(h["kind"], h["reason"]) for h in watchd["held"]] == [("drain", "breaker open: 3/1 of gpu")]
    gpu = next(p for p in doc["partitions"] if p["partition"] == "gpu")
    assert (gpu["nodes"], gpu["unavailable"]) == (6, 3)
    text = io.StringIO()
    assert await asyncio.to_thread(run_drains, connect(url), False, False, "watchd", text) == 0
    assert "gpu-2" in text.getvalue() and "requeued jobs: 100" in text.getvalue()
    assert "gpu-5" not in text.getvalue()
    async with aiohttp.ClientSession() as s, s.get(f"{url}/api/v1/status") as r:
        status = await r.json()
    assert status["drains"]["by_owner"] == {"watchd": 1, "admin": 1, "nhc": 1, "scheduler": 1, "other": 1}


async def test_drains_by_others_become_events_once_and_overdue_ones_again() -> None:
    fake, fl = fleet()
    fake.set_admin_drain("gpu-3", "swap DIMM")
    fl.since["gpu-3"] = time.time() - 10 * 86400
    fake.set_admin_drain("gpu-4", "NHC: x")
    fl.since["gpu-4"] = time.time() - 60
    await fake.drain({"gpu-5": "Xid 79"})  # watchd's own: no event until it is overdue
    fl.since["gpu-5"] = time.time() - 60
    async with Engine(config(spares=0, alert_after_s=86400, remind_every_s=3600), scheduler=fake) as engine:
        seen: list[NodeUnavailable] = []
        sent = engine.fleet.emit
        engine.fleet.emit = lambda e: (seen.append(NodeUnavailable.from_attrs(e.attrs)), sent(e))[-1]  # type: ignore[method-assign]
        engine.fleet._reported.clear()
        await engine.fleet.poll()
        first = [(s.reason, s.reminder, s.overdue) for s in seen]
        assert first == [("swap DIMM", False, False), ("swap DIMM", True, True), ("NHC: x", False, False)]
        seen.clear()
        await engine.fleet.poll()
        assert seen == []  # once per drain; the overdue reminder waits remind_every_s
        await eventually(
            lambda: any(a["rule"] == "node-unavailable-overdue" for a in engine.recent_actions(100)),
            what="the default alert for an overdue drain",
        )


async def test_dry_run_only_audits_spares() -> None:
    fake, fl = fleet()
    async with Engine(config(mode="dry-run", spares=2), scheduler=fake) as engine:
        assert fl.reserved == {}
        [a] = [a for a in engine.recent_actions(10) if a["action"] == "spare"]
        assert a["outcome"] == "dry_run" and "gpu-1, gpu-2" in str(a["detail"])


async def test_a_failing_listing_keeps_the_last_one_and_is_counted() -> None:
    from watchd.integrations.base import SchedulerError

    fake, _ = fleet()
    fake.set_admin_drain("gpu-3", "x")
    async with Engine(config(spares=0), scheduler=fake) as engine:
        fake.error = SchedulerError(
            "sinfo: exit status 1: slurm_load_node: Unable to contact slurm controller"
        )
        await engine.fleet.poll()
        doc = engine.fleet.document()
        assert [r["node"] for r in doc["unavailable"]] == ["gpu-3"]
        assert "Unable to contact" in doc["errors"]["fake"]
        fake.error = None


@pytest.mark.real
async def test_fleet_metrics_pass_promtool(
    running: tuple[Engine, FakeScheduler, FakeFleet], promtool: str
) -> None:
    engine, fake, _ = running
    fake.set_admin_drain("gpu-5", "swap DIMM")
    fake.set_down("cpu-1", "Not responding")
    await engine.fleet.poll()
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{engine.port}/metrics") as r:
        text = await r.text()
    assert 'watchd_unavailable_nodes{owner="admin",partition="gpu",reason_class="admin"} 1.0' in text
    assert (
        'watchd_unavailable_nodes{owner="scheduler",partition="cpu",reason_class="not_responding"} 1.0'
        in text
    )
    assert 'watchd_partition_available_ratio{partition="cpu"} 0.5' in text
    assert 'watchd_spare_nodes{partition="gpu"} 1.0' in text
    check = [promtool, "check", "metrics"]
    res = await asyncio.to_thread(
        subprocess.run, check, input=text, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(
    ("who", "lease"),
    [
        ("follower", ScriptedLease(False, 0)),
        ("deposed between the stage and the call", ScriptedLease(True, 1)),
    ],
)
async def test_a_follower_or_a_deposed_leader_never_changes_spares(who: str, lease: ScriptedLease) -> None:
    from prometheus_client import CollectorRegistry

    from watchd.actions.audit import MemoryAudit
    from watchd.actions.executor import ActionExecutor
    from watchd.clock import SystemClock
    from watchd.engine.metrics import EngineMetrics
    from watchd.fleetview.watch import FleetWatch
    from watchd.integrations.fleet import FLEET_VERBS
    from watchd.port import gated

    fake, fl = fleet()
    clock = SystemClock()
    audit = MemoryAudit()
    executor = ActionExecutor(fake, "enforce", clock, EngineMetrics(), audit, leadership=lease)

    async def act(kind: str, node: str, params: object) -> object:
        return await executor.act(kind, node, params, rule="spares")  # type: ignore[arg-type]

    watch = FleetWatch(
        [gated(fl, FLEET_VERBS, executor.leader_gate.now)],
        drains=DrainsConfig(),
        spares=SparesConfig(partitions={"gpu": 2}),
        clock=clock,
        registry=CollectorRegistry(),
        store=executor.store,
        emit=lambda e: None,
        act=act,  # type: ignore[arg-type]
        leading=lambda: True,  # what it believed at its last renewal
    )
    executor.attach(spares=watch)
    async with executor:
        await watch.poll()
        assert len(watch.nodes) == 8 and fl.reserved == {}
        fl.reserved["gpu"] = ["gpu-1"]
        result = await executor.act("spare_release", "gpu-2", {"jobs": "7"}, rule="operator")
    assert fl.reserved == {"gpu": ["gpu-1"]}
    assert not [c for c in fl.calls if c[0] == "set_spares"], who
    assert str(result.outcome) == "failed" and "not the leader" in result.detail
    assert [(a.action, a.outcome) for a in audit.entries] == [
        ("spare", "failed"),
        ("spare_release", "failed"),
    ]
