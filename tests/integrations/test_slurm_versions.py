"""watchd's Slurm paths on two live Slurm versions: the host's 22.05 (bookworm) and 24.11 (trixie, in a
debootstrapped root: tests/harness/slurm_root.py). Each path through watchd's own code, against a real
cluster of each version: drain, the running jobs, requeue, resume, the fleet listing behind ``watchd
drains``, the checks' view of an idle node, and the usage report's pending jobs (without slurmdbd: its
fallback). Every call is counted in ``watchd_slurm_calls_total``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.slurm import ROOT_VERSION, VERSIONS, SlurmCluster, available
from tests.harness.slurm_root import slurm_root, slurm_version
from tests.support import real_components_required, wait_for
from watchd.fleetview.drains import unavailable_nodes
from watchd.integrations.slurm.calls import counts
from watchd.integrations.slurm.checks import SlurmCheckRunner
from watchd.integrations.slurm.fleet import SlurmFleet
from watchd.integrations.slurm.scheduler import SlurmScheduler
from watchd.reports.source import SlurmAccounting

pytestmark = [pytest.mark.slurm, pytest.mark.real]


@pytest.fixture(scope="module", params=VERSIONS)
def cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    version = str(request.param)
    ok, why = available(version)
    if not ok:
        if real_components_required():
            pytest.fail(f"Slurm {version} test cluster required (CI) but unavailable: {why}")
        pytest.skip(why)
    with SlurmCluster(real_nodes=2, simulated_nodes=2, version=version) as c:
        yield c


def scheduler(c: SlurmCluster) -> SlurmScheduler:
    return SlurmScheduler(env=c.env)


def test_the_cluster_runs_the_version_it_names(cluster: SlurmCluster) -> None:
    out = cluster.run("sinfo", "--version").stdout
    assert out.startswith(f"slurm-wlm {cluster.version}") or out.startswith(f"slurm {cluster.version}"), out
    if cluster.version == ROOT_VERSION:
        assert slurm_version(slurm_root()).startswith(ROOT_VERSION)


async def test_drain_running_jobs_requeue_and_resume(cluster: SlurmCluster) -> None:
    async with scheduler(cluster) as s:
        job = cluster.submit("sleep 300", nodes=2)
        cluster.wait_job_running(job)
        pending = cluster.submit("sleep 300", nodes=2)  # waits behind the first: not a running job
        try:
            running = await s.running_jobs()
            assert [(j.id, j.nodes, j.partition) for j in running] == [
                (f"slurm:{job}", ("gpu-1", "gpu-2"), "gpu")
            ]
            assert running[0].start_time is not None and running[0].user == "root"

            reason = "watchd: Xid79 3b:00 GPU has fallen off the bus (GPU 0000:3b:00.0)"
            result = await s.drain({"gpu-1": reason})
            assert result["gpu-1"].outcome == "drained"
            st = (await s.node_states(["gpu-1"]))["gpu-1"]
            assert st.drained and st.reason == reason

            requeued = await s.requeue_jobs_on("gpu-1")
            assert requeued.requeued == (job,), requeued
            wait_for(
                lambda: cluster.job(job)["JobState"] in ("PENDING", "REQUEUED"), timeout=30, what="requeue"
            )

            resumed = await s.resume("gpu-1")
            assert resumed.outcome == "resumed", resumed
            assert not (await s.node_states(["gpu-1"]))["gpu-1"].drained
        finally:
            cluster.cancel(job, pending)
            cluster.reset_nodes()


async def test_the_fleet_listing_behind_watchd_drains(cluster: SlurmCluster) -> None:
    cluster.wait_nodes_responding(cluster.real_node_names)  # a node resumed just now is pinged first
    cluster.drain("gpu-2", "watchd: GPU3 ECC DBE: volatile DBE count 2 (GPU 0000:3b:00.0)")
    cluster.drain("sim-1", "swap DIMM B3")
    try:
        async with scheduler(cluster) as s:
            nodes = {n.name: n for n in await SlurmFleet(s).fleet_nodes()}
        assert nodes["gpu-2"].reason == "watchd: GPU3 ECC DBE: volatile DBE count 2 (GPU 0000:3b:00.0)"
        assert "DRAIN" in nodes["gpu-2"].flags and nodes["gpu-2"].partitions == ("gpu",)
        assert nodes["gpu-2"].user == "root" and nodes["gpu-2"].since is not None
        assert nodes["sim-1"].reason == "swap DIMM B3"
        # gpu-1 was drained and resumed by the test before: 22.05 clears the reason at RESUME, 24.11 keeps
        # it on the idle node (sinfo %E and scontrol show it): watchd lists it as in service all the same
        assert nodes["gpu-1"].state == "idle" and not nodes["gpu-1"].out_of_service
        assert (nodes["gpu-1"].reason is None) == (cluster.version != ROOT_VERSION)
        assert sorted(u.node for u in unavailable_nodes(nodes.values(), time.time())) == ["gpu-2", "sim-1"]
    finally:
        cluster.reset_nodes()


async def test_the_checks_see_idle_busy_and_drained_nodes(cluster: SlurmCluster, tmp_path: Path) -> None:
    job = cluster.submit("sleep 300", nodes=1)
    info = cluster.wait_job_running(job)
    busy = info["NodeList"]
    other = next(n for n in cluster.real_node_names if n != busy)
    cluster.drain("sim-2", "watchd: nccl 312GB/s: nccl busbw 312 GB/s < 80% of 450 GB/s")
    try:
        async with scheduler(cluster) as s:
            runner = SlurmCheckRunner(s, output_dir=tmp_path)
            seen = await runner.availability([busy, other, "sim-2"], 600)
        assert seen[other].idle and seen[other].partitions == ("gpu",)
        assert not seen[busy].idle, seen[busy]  # "node is mixed": the job holds 1 of its 4 CPUs
        assert not seen["sim-2"].idle and seen["sim-2"].drained_by_watchd
    finally:
        cluster.cancel(job)
        cluster.reset_nodes()


def test_the_usage_reports_pending_jobs_without_accounting(cluster: SlurmCluster) -> None:
    first = cluster.submit("sleep 300", nodes=2)
    cluster.wait_job_running(first)
    waiting = cluster.submit("sleep 300", nodes=2)
    try:
        accounting = SlurmAccounting(env=cluster.env).fetch(0.0, 1e10)
        assert not accounting.available and "sacct" in accounting.why  # no slurmdbd here
        assert [(p.job_id, p.partition, p.user) for p in accounting.pending] == [(waiting, "gpu", "root")]
    finally:
        cluster.cancel(first, waiting)


def test_every_call_is_counted(cluster: SlurmCluster) -> None:
    before = counts()
    SlurmAccounting(env=cluster.env).fetch(0.0, 1.0)
    after = counts()
    assert after.get("squeue", 0) == before.get("squeue", 0) + 1
    assert after.get("sacct", 0) == before.get("sacct", 0) + 1
    assert os.environ.get("PATH") != cluster.env["PATH"] or cluster.version != ROOT_VERSION
