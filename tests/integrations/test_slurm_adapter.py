"""SlurmScheduler against a real Slurm 22.05 cluster (tests/harness/slurm.py), plus parsing and error paths.

The cluster is session-scoped and shared: every test resumes the nodes it drained and cancels its jobs.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.harness.slurm import SlurmCluster
from watchd.integrations.base import SchedulerError
from watchd.integrations.slurm.scheduler import (
    SlurmScheduler,
    compress_hostlist,
    expand_hostlist,
    parse_node_line,
    parse_state,
)
from watchd.model.nodes import WATCHD_REASON_PREFIX

slurm = pytest.mark.slurm


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The shared cluster, restored after the test: jobs cancelled, every drained node resumed."""
    slurm_cluster.reset_nodes()
    yield slurm_cluster
    slurm_cluster.run("scancel", "--user=root", check=False)
    slurm_cluster.reset_nodes()


@pytest.fixture(params=[True, False], ids=["persistent", "one-shot"])
def persistent(request: pytest.FixtureRequest) -> bool:
    """Every adapter test runs through the interactive scontrol session and through one-shot processes."""
    return bool(request.param)


@pytest.fixture
async def sched(cluster: SlurmCluster, persistent: bool) -> AsyncIterator[SlurmScheduler]:
    async with SlurmScheduler(
        env={"SLURM_CONF": cluster.env["SLURM_CONF"]}, timeout=20, persistent=persistent
    ) as s:
        yield s
        if persistent:  # the session did the work: no silent fallback to one-shot processes
            assert s.session is not None and s.session_fallbacks == 0


# --------------------------------------------------------------------------- real cluster
@slurm
async def test_node_states_reads_real_nodes(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    states = await sched.node_states(["gpu-1", "gpu-2", "sim-7", "no-such-node"])
    assert set(states) == {"gpu-1", "gpu-2", "sim-7"}  # unknown names are left out, not an error
    assert states["gpu-1"].state == "idle" and not states["gpu-1"].drained
    assert states["gpu-1"].reason is None


@slurm
async def test_drain_idle_node_sets_drain_with_watchd_reason(
    cluster: SlurmCluster, sched: SlurmScheduler
) -> None:
    res = await sched.drain({"gpu-1": "xid 79: GPU has fallen off the bus"})
    assert res["gpu-1"].outcome == "drained"
    assert cluster.node_state("gpu-1") == "IDLE+DRAIN"
    assert cluster.reason("gpu-1") == f"{WATCHD_REASON_PREFIX} xid 79: GPU has fallen off the bus"
    sinfo = cluster.run("sinfo", "-h", "-R", "-o", "%N|%E").stdout
    assert f"gpu-1|{WATCHD_REASON_PREFIX} xid 79" in sinfo
    st = (await sched.node_states(["gpu-1"]))["gpu-1"]
    assert st.drained and st.reason == f"{WATCHD_REASON_PREFIX} xid 79: GPU has fallen off the bus"


@slurm
async def test_drain_twice_is_already_drained(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    assert (await sched.drain({"gpu-2": "watchd: xid 48"}))["gpu-2"].outcome == "drained"
    again = await sched.drain({"gpu-2": "watchd: something else"})
    assert again["gpu-2"].outcome == "already_drained"
    assert cluster.reason("gpu-2") == "watchd: xid 48"  # the first reason stands


@slurm
async def test_a_replacing_drain_changes_watchd_s_reason_and_only_watchd_s(
    cluster: SlurmCluster, sched: SlurmScheduler
) -> None:
    """The lemon rule's drain: through the executor's batcher, on the real cluster, a node watchd drained
    gets the new reason; a node an admin drained is left alone even so."""
    from watchd.actions.drain_batcher import DrainBatcher

    assert (await sched.drain({"gpu-2": "watchd: xid 48"}))["gpu-2"].outcome == "drained"
    cluster.drain("gpu-3", "maintenance")
    batcher = DrainBatcher(sched)
    batcher.start()
    try:
        lemon = "lemon node: implicated twice in 28 days"
        replaced = await batcher.drain("gpu-2", lemon, replace=True)
        untouched = await batcher.drain("gpu-3", lemon, replace=True)
        plain = await batcher.drain("gpu-2", "watchd: another fault")
    finally:
        await batcher.stop()
    assert replaced.outcome == "drained" and "replacing 'watchd: xid 48'" in replaced.detail
    assert cluster.node_state("gpu-2") == "IDLE+DRAIN" and cluster.reason("gpu-2") == f"watchd: {lemon}"
    assert untouched.outcome == "skipped" and cluster.reason("gpu-3") == "maintenance"
    assert plain.outcome == "already_drained" and cluster.reason("gpu-2") == f"watchd: {lemon}"


@slurm
async def test_admin_drained_node_is_never_touched(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    cluster.drain("gpu-3", "maintenance")
    before = cluster.node("gpu-3")["Reason"]
    res = await sched.drain({"gpu-3": "xid 79", "gpu-4": "xid 79"})
    assert res["gpu-3"].outcome == "skipped" and "maintenance" in res["gpu-3"].detail
    assert res["gpu-4"].outcome == "drained"
    assert cluster.node("gpu-3")["Reason"] == before  # same text, same user and timestamp
    resumed = await sched.resume("gpu-3")
    assert resumed.outcome == "refused" and "maintenance" in resumed.detail
    assert cluster.node_state("gpu-3") == "IDLE+DRAIN" and cluster.reason("gpu-3") == "maintenance"


@slurm
async def test_down_node_with_foreign_reason_is_skipped(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    cluster.run("scontrol", "update", "NodeName=sim-200", "State=DOWN", "Reason=psu dead")
    try:
        res = await sched.drain({"sim-200": "xid 79"})
        assert res["sim-200"].outcome == "skipped" and "psu dead" in res["sim-200"].detail
        assert cluster.reason("sim-200") == "psu dead"
    finally:
        cluster.resume("sim-200")


@slurm
async def test_unknown_node_fails_alone(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    # scontrol itself would drain gpu-1 and then fail on the bad name: the adapter must not send it
    res = await sched.drain({"gpu-1": "xid 79", "nope-1": "xid 79"})
    assert res["nope-1"].outcome == "failed"
    assert res["gpu-1"].outcome == "drained"
    assert cluster.node_state("gpu-1") == "IDLE+DRAIN"


@slurm
async def test_burst_drain_150_nodes_in_one_call(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    names = [f"sim-{i}" for i in range(1, 151)]
    reasons = {n: "xid 79: GPU has fallen off the bus" for n in names}
    reasons["sim-3"] = "xid 48: double bit ECC"  # a second reason group
    res = await sched.drain(reasons)
    assert {r.outcome for r in res.values()} == {"drained"}
    states = await sched.node_states(names)
    assert all(s.drained for s in states.values()) and len(states) == 150
    assert states["sim-3"].reason == "watchd: xid 48: double bit ECC"
    assert states["sim-150"].reason == "watchd: xid 79: GPU has fallen off the bus"
    assert not (await sched.node_states(["sim-151"]))["sim-151"].drained


@slurm
async def test_resume_only_watchd_drained_nodes(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    await sched.drain({"gpu-1": "xid 79"})
    res = await sched.resume("gpu-1")
    assert res.outcome == "resumed"
    # right after RESUME slurmctld pings the node: IDLE+NOT_RESPONDING for a moment, then IDLE
    assert cluster.node_state("gpu-1").startswith("IDLE") and "DRAIN" not in cluster.node_state("gpu-1")
    assert cluster.reason("gpu-1") is None
    cluster.wait_nodes_responding(["gpu-1"])
    assert cluster.node_state("gpu-1") == "IDLE"
    assert (await sched.resume("gpu-1")).outcome == "not_drained"
    assert (await sched.resume("nope-1")).outcome == "failed"


@slurm
async def test_requeue_jobs_on_drained_node(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    # both jobs share gpu-1 and gpu-2 (4 CPUs per node, 1 per job)
    requeueable = cluster.submit("sleep 600", nodes=2, requeue=True, extra_args=["-w", "gpu-1,gpu-2"])
    pinned = cluster.submit("sleep 600", nodes=2, requeue=False, extra_args=["-w", "gpu-1,gpu-2"])
    cluster.wait_job_running(requeueable)
    cluster.wait_job_running(pinned)

    assert (await sched.drain({"gpu-1": "xid 79"}))["gpu-1"].outcome == "drained"
    assert cluster.node_state("gpu-1") == "MIXED+DRAIN"  # draining: jobs still on it

    res = await sched.requeue_jobs_on("gpu-1")
    assert res.requeued == (requeueable,)
    assert res.not_requeueable == (pinned,)
    assert res.ok

    info = cluster.wait_job_state(requeueable, ["PENDING"], timeout=30)
    assert info["Restarts"] == "1"
    assert cluster.job(pinned)["JobState"] == "RUNNING"
    # idempotent: the requeued job is no longer on the node
    again = await sched.requeue_jobs_on("gpu-1")
    assert again.requeued == () and again.not_requeueable == (pinned,)


@slurm
async def test_requeue_of_one_job_leaves_the_node_s_others(
    cluster: SlurmCluster, sched: SlurmScheduler
) -> None:
    """A finding names its job: only that one is requeued, by its watchd label or its bare id."""
    first = cluster.submit("sleep 600", nodes=1, requeue=True, extra_args=["-w", "gpu-3"])
    second = cluster.submit("sleep 600", nodes=1, requeue=True, extra_args=["-w", "gpu-3"])
    cluster.wait_job_running(first)
    cluster.wait_job_running(second)
    res = await sched.requeue_jobs_on("gpu-3", f"slurm:{first}")
    assert res.requeued == (first,) and res.not_requeueable == () and res.ok
    cluster.wait_job_state(first, ["PENDING"], timeout=30)
    assert cluster.job(second)["JobState"] == "RUNNING"
    assert (await sched.requeue_jobs_on("gpu-3", "999999")).requeued == ()  # not on the node: nothing
    assert (await sched.requeue_jobs_on("gpu-3", second)).requeued == (second,)


@slurm
async def test_requeue_on_idle_node_is_empty(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    res = await sched.requeue_jobs_on("gpu-4")
    assert res.requeued == () and res.not_requeueable == () and res.ok


@slurm
async def test_requeue_unknown_node_raises(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    with pytest.raises(SchedulerError, match="nope-1"):
        await sched.requeue_jobs_on("nope-1")


@slurm
@pytest.mark.parametrize(
    "reason",
    [
        'xid 13: "Graphics Exception" on [gpu 0]',  # ends with a quote: scontrol strips one, we send two
        "it's a=b c:d [x] State=DOWN Reason=y",
        'odd "quote count',
        'a" b',  # cannot stay one word in interactive scontrol: sent one-shot
        "non-ascii \u00e9t\u00e9",  # sent one-shot
    ],
)
async def test_awkward_reason_round_trips_exactly(
    cluster: SlurmCluster, sched: SlurmScheduler, reason: str
) -> None:
    res = await sched.drain({"sim-17": reason})
    assert res["sim-17"].outcome == "drained"
    assert cluster.reason("sim-17") == f"{WATCHD_REASON_PREFIX} {reason}"
    st = (await sched.node_states(["sim-17"]))["sim-17"]
    assert st.reason == f"{WATCHD_REASON_PREFIX} {reason}"
    assert (await sched.drain({"sim-17": reason}))["sim-17"].outcome == "already_drained"
    assert (await sched.resume("sim-17")).outcome == "resumed"


@slurm
async def test_session_killed_between_calls_falls_back_then_respawns(cluster: SlurmCluster) -> None:
    async with SlurmScheduler(env={"SLURM_CONF": cluster.env["SLURM_CONF"]}, timeout=20) as sched:
        assert sched.session is not None
        await sched.node_states(["gpu-1"])
        first = sched.session.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        res = await sched.drain({"sim-21": "xid 79"})  # fails over to one-shot if the death shows only now
        assert res["sim-21"].outcome == "drained" and "DRAIN" in cluster.node_state("sim-21")
        assert (await sched.resume("sim-21")).outcome == "resumed"
        assert sched.session.pid not in (None, first)
        assert sched.session.starts == 2 and sched.session_fallbacks <= 1
    assert sched.session.pid is None  # aclose() stopped it


# --------------------------------------------------------------------------- errors (no cluster needed)
def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-scontrol"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def test_missing_binary_raises_scheduler_error(persistent: bool) -> None:
    sched = SlurmScheduler(scontrol="/nonexistent/scontrol", persistent=persistent)
    with pytest.raises(SchedulerError, match=r"/nonexistent/scontrol.*cannot run"):
        await sched.node_states(["gpu-1"])
    with pytest.raises(SchedulerError):
        await sched.drain({"gpu-1": "x"})


async def test_timeout_kills_the_process(tmp_path: Path, persistent: bool) -> None:
    pidfile = tmp_path / "pid"
    sched = SlurmScheduler(
        scontrol=_script(tmp_path, f"echo $$ > {pidfile}; exec sleep 30"), timeout=0.5, persistent=persistent
    )
    t0 = time.monotonic()
    with pytest.raises(SchedulerError, match=r"timed out after 0.5s"):
        await sched.resume("gpu-1")
    assert time.monotonic() - t0 < 0.9  # a timeout is not retried one-shot
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_failure_carries_command_status_and_stderr(tmp_path: Path, persistent: bool) -> None:
    # (persistent: the script is no interactive scontrol; the session fails to start, the call goes one-shot)
    sched = SlurmScheduler(
        scontrol=_script(tmp_path, "echo 'slurm_load_node error: boom' >&2; exit 3"), persistent=persistent
    )
    with pytest.raises(SchedulerError) as exc:
        await sched.node_states(["gpu-1"])
    msg = str(exc.value)
    assert "show node -o gpu-1" in msg and "exit status 3" in msg and "boom" in msg


async def test_failed_drain_group_marks_only_its_nodes(tmp_path: Path, persistent: bool) -> None:
    # `show` answers, `update` fails for one reason group only
    body = """
case "$1" in
show) for n in $(echo "$4" | tr ',' ' '); do echo "NodeName=$n Arch=x86_64 State=IDLE Weight=1"; done ;;
update) case "$4" in *bad*) echo "slurm_update error: Invalid node state specified" >&2; exit 1 ;; esac ;;
esac
"""
    sched = SlurmScheduler(scontrol=_script(tmp_path, body), persistent=persistent)
    res = await sched.drain({"a": "good", "b": "bad", "c": "good"})
    assert res["a"].outcome == "drained" and res["c"].outcome == "drained"
    assert res["b"].outcome == "failed" and "Invalid node state" in res["b"].detail


# --------------------------------------------------------------------------- parsing
IDLE_DRAIN = (
    "NodeName=gpu-1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=0.04 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost "
    "Port=50265 Version=22.05.8 OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 "
    "FreeMem=23885 Sockets=4 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
    "MCS_label=N/A Partitions=gpu  BootTime=2026-12-02T10:41:58 SlurmdStartTime=2026-12-02T11:04:11 "
    "LastBusyTime=2026-12-02T11:04:11 CfgTRES=cpu=4,mem=1M,billing=4 AllocTRES= CapWatts=n/a CurrentWatts=0 "
    "AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=watchd: xid 79 [gpu 0] = bad State=X [root@2026-12-02T11:04:29]"
)


def test_parse_node_line_with_tricky_reason() -> None:
    st = parse_node_line(IDLE_DRAIN)
    assert st is not None
    assert st.name == "gpu-1" and st.state == "idle" and st.flags == {"DRAIN"}
    assert st.reason == "watchd: xid 79 [gpu 0] = bad State=X"


@pytest.mark.parametrize(
    ("raw", "base", "flags"),
    [
        ("IDLE", "idle", set()),
        ("IDLE+DRAIN", "idle", {"DRAIN"}),
        ("MIXED+DRAIN", "mixed", {"DRAIN"}),
        ("ALLOCATED", "allocated", set()),
        ("DOWN*+DRAIN", "down", {"DRAIN", "NOT_RESPONDING"}),
        ("DOWN+DRAIN+NOT_RESPONDING", "down", {"DRAIN", "NOT_RESPONDING"}),
        ("IDLE*", "idle", {"NOT_RESPONDING"}),
        ("UNKNOWN+DRAIN", "unknown", {"DRAIN"}),
    ],
)
def test_parse_state(raw: str, base: str, flags: set[str]) -> None:
    assert parse_state(raw) == (base, frozenset(flags))


def test_hostlist_round_trip() -> None:
    names = [f"sim-{i}" for i in (1, 2, 3, 5, 9, 10, 11)] + ["n01", "n02", "n10", "login"]
    expr = compress_hostlist(names)
    assert expr == "login,n10,n[01-02],sim-[1-3,5,9-11]"
    assert sorted(expand_hostlist(expr)) == sorted(names)
    assert compress_hostlist(["gpu-7"]) == "gpu-7"
