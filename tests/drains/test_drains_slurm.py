"""``watchd drains`` and the hot spares on the real Slurm test cluster (tests/harness/slurm.py).

Drains of every owner class are made with ``scontrol`` and the classified listing is compared with what
``sinfo -R`` prints; spares are a real reservation, released when a real job is requeued off a drained node,
and the requeued job starts on the spare."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from tests.harness.slurm import SlurmCluster
from tests.support import eventually, xid_event
from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.fleetview.drains import unavailable_nodes
from watchd.fleetview.settings import SparesConfig
from watchd.http_settings import Listen
from watchd.integrations.base import SchedulerError
from watchd.integrations.slurm.fleet import RESERVATION_PREFIX, SlurmFleet, parse_slurm_time
from watchd.integrations.slurm.scheduler import SlurmScheduler

pytestmark = pytest.mark.slurm


@pytest.fixture
async def slurm(slurm_cluster: SlurmCluster) -> AsyncIterator[SlurmScheduler]:
    async with SlurmScheduler(env=slurm_cluster.env) as scheduler:
        yield scheduler


def sinfo_r(cluster: SlurmCluster) -> dict[str, tuple[str, str, float | None]]:
    """``sinfo -R`` as an operator reads it: node -> (reason, user, since). ``%N``, the node's name: the
    ``%n`` of the issue's command line is its *hostname*, ``localhost`` for every node of this cluster."""
    out = cluster.run("sinfo", "-R", "-h", "-o", "%N|%u|%H|%E").stdout
    rows: dict[str, tuple[str, str, float | None]] = {}
    for line in out.splitlines():
        nodes, user, when, reason = line.split("|", 3)
        for n in nodes.split(","):  # one line per reason, nodes compressed: the ones drained here are apart
            rows[n.strip()] = (reason.strip(), user.strip(), parse_slurm_time(when))
    return rows


async def test_every_owner_class_as_sinfo_r_shows_it(sim: SlurmCluster, slurm: SlurmScheduler) -> None:
    result = await slurm.drain({"sim-11": "Xid 79 GPU 0000:3b:00.0 GPU has fallen off the bus"})
    assert result["sim-11"].outcome == "drained"
    sim.drain("sim-12", "swap DIMM B3 -- ticket 4711")
    sim.drain("sim-13", "NHC: check_hw_eth: eth0 missing")
    sim.run("scontrol", "update", "NodeName=sim-14", "State=DOWN", "Reason=Kill task failed")
    sim.run("scontrol", "update", "NodeName=sim-15", "State=DOWN", "Reason=Not responding")
    sim.run("scontrol", "update", "NodeName=sim-16", "State=DRAIN", "Reason=Node unexpectedly rebooted")
    fleet = SlurmFleet(slurm)
    nodes = await fleet.fleet_nodes()
    assert len(nodes) == len(sim.all_node_names)
    listed = {u.node: u for u in unavailable_nodes(nodes, time.time())}
    expected = {
        "sim-11": ("watchd", "xid"),
        "sim-12": ("admin", "admin"),
        "sim-13": ("nhc", "nhc"),
        "sim-14": ("scheduler", "kill_task_failed"),
        "sim-15": ("scheduler", "not_responding"),
        "sim-16": ("scheduler", "unexpected_reboot"),
    }
    assert {n: (listed[n].owner, listed[n].reason_class) for n in expected} == expected
    # the same reason, user and time as sinfo -R, for every node it lists
    r = sinfo_r(sim)
    assert set(r) == set(listed)
    for name, (reason, user, since) in r.items():
        u = listed[name]
        assert (u.reason, u.user, u.since) == (reason, user, since)
        assert u.age_s is not None and 0 <= u.age_s < 600
    assert listed["sim-11"].reason.startswith("watchd: Xid 79")
    assert listed["sim-14"].state.startswith("DOWN")


def reservation(cluster: SlurmCluster) -> str:
    return cluster.run("scontrol", "show", "reservation", "-o", check=False).stdout


async def test_spare_released_for_the_requeued_job_stays_free_until_it_runs_on_it(
    slurm_cluster: SlurmCluster, slurm: SlurmScheduler
) -> None:
    """The loop as a site runs it: an engine with the shipped defaults (the default rule pack, the default
    breaker, drains polled every 60 s) and one spare; an Xid drains a busy node, its job is requeued, the
    spare released. Slurm holds the requeued job back for cred_expire (120 s), longer than the drains
    poll: the poll in between must not take the spare back, nor a node the job needs."""
    cluster = slurm_cluster
    cluster.reset_nodes(cluster.real_node_names)
    config = EngineConfig(
        listen=Listen(port=0), mode="enforce", spares=SparesConfig(partitions={"gpu": 1})
    )  # the embedded default rules, safety and drains
    jobs: list[str] = []
    drained: str | None = None
    try:
        async with Engine(config, scheduler=slurm) as engine:
            fleet = engine.fleet.backends[0]
            assert await fleet.spares() == {"gpu": ["gpu-1"]}  # the first idle node, one as configured
            assert f"ReservationName={RESERVATION_PREFIX}gpu" in reservation(cluster)
            # fill every other node with exclusive jobs: the spare is kept out of normal scheduling
            jobs.append(cluster.submit("sleep 600", nodes=1, extra_args=["--exclusive"]))
            jobs.append(cluster.submit("sleep 600", nodes=2, extra_args=["--exclusive"]))
            running = [cluster.wait_job_running(j) for j in jobs]
            assert not any("gpu-1" in info["NodeList"] for info in running)
            victim, victim_node = jobs[0], running[0]["NodeList"]
            # never a spare taken from a running job: Slurm refuses it, and the plan does not ask
            with pytest.raises(SchedulerError, match="busy"):
                await fleet.set_spares("gpu", ["gpu-1", victim_node])
            await engine.fleet.poll()
            assert await fleet.spares() == {"gpu": ["gpu-1"]}
            # an Xid on the victim's node: drained, its job requeued, the spare released, through the pipeline
            engine.queue.put_nowait((xid_event(victim_node, event_id="x-spare"), time.monotonic()))
            drained = victim_node
            await eventually(
                lambda: any(a["action"] == "spare_release" for a in engine.recent_actions(50)), 20.0
            )
            actions = {a["action"]: a for a in engine.recent_actions(50) if a["node"] == victim_node}
            assert actions["drain"]["outcome"] == "drained"
            assert actions["requeue"]["result"]["requeued"] == [victim]
            release = actions["spare_release"]
            assert release["outcome"] == "released" and release["result"]["spare"] == "gpu-1"
            assert await fleet.spares() == {}
            assert f"{RESERVATION_PREFIX}gpu" not in reservation(cluster)
            info = cluster.wait_job_state(victim, ["PENDING"])
            assert info.get("Reason") == "BeginTime"  # Slurm's cred_expire hold
            # the drains poll comes (every 60 s by default) while the job is held: the pool stays as it is
            await engine.fleet.poll()
            assert await fleet.spares() == {}
            # lift Slurm's hold here (benchmarks/pause.py measures the whole delay): it starts on the spare
            cluster.run("scontrol", "update", f"JobId={victim}", "StartTime=now")
            info = cluster.wait_job_running(victim, timeout=60)
            assert info["NodeList"] == "gpu-1"
            assert int(info["Restarts"]) == 1
            # running again: the pool is free to be topped up, and nothing is idle to top it up from
            await engine.fleet.poll()
            assert await fleet.spares() == {}
            spare_audit = [a["outcome"] for a in engine.recent_actions(50) if a["action"] == "spare"]
            assert spare_audit == ["changed"]  # the first top-up, at start
    finally:
        cluster.cancel(*jobs)
        cluster.run("scontrol", "delete", f"ReservationName={RESERVATION_PREFIX}gpu", check=False)
        if drained:
            cluster.reset_nodes([drained])
