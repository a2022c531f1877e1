"""Active checks on the real Slurm test cluster (tests/harness/slurm.py): check jobs submitted by a real
engine with ``sbatch`` and run by slurmd on the idle nodes, stand-in ``all_reduce_perf`` and ``dcgmi``
executables printing the recorded real outputs (tests/data/checks), the default rule pack draining through
real ``scontrol``, and the validated return to service through the engine's HTTP API and the CLI.

The stand-ins read what to do from a file named after the node (``$SLURMD_NODENAME``): ``pass``, ``low``
(the recorded single-node pass with its largest size at 312 GB/s: a slow node), ``wrong`` (#wrong 3),
``crash`` (the recorded CUDA failure, exit 1), ``hang`` (sleeps past the time limit). Each writes when it
started and ended, so the share cap is checked on what slurmd really ran."""

from __future__ import annotations

import asyncio
import io
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.checks.conftest import behave
from tests.harness.slurm import SlurmCluster
from watchd.checks_cli import run_checks, run_validate
from watchd.config import EngineConfig
from watchd.engine.runner import Engine
from watchd.integrations.slurm.checks import SlurmCheckRunner
from watchd.reach import connect

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parent.parent.parent


def engine_config(cluster: SlurmCluster, standins: Path, tmp_path: Path, **spec: Any) -> EngineConfig:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    out.chmod(0o750)  # the engine refuses an output folder others can write
    items = [
        {
            "name": "nccl",
            "type": "nccl",
            "command": [str(standins / "all_reduce_perf"), "-b", "256M", "-e", "2G", "-f", "2", "-g", "8"],
            "partitions": ["gpu"],
            "max_share": 0.5,
            "time_limit": "6s",
            **spec,
        },
        {
            "name": "dcgm",
            "type": "dcgm-diag",
            "command": [str(standins / "dcgmi"), "diag", "-r", "2"],
            "time_limit": "20s",
        },
    ]
    return EngineConfig.model_validate(
        {
            "listen": {"port": 0},
            "auth": {"token": "t0ken"},
            "mode": "enforce",
            "rules": [str(ROOT / "rules")],
            "slurm": {"slurm_conf": str(cluster.conf_path)},
            "safety": {"max_fraction": 1.0},
            "state": {"path": str(tmp_path / "state.db")},
            "checks": {
                "enabled": True,
                "runner": "slurm",
                "output_dir": str(out),
                "slurm": {"poll_interval_s": 0.2, "grace": "3s", "partition": "gpu"},
                "items": items,
            },
        }
    )


@pytest.fixture
async def engine(cluster: SlurmCluster, standins: Path, tmp_path: Path) -> AsyncIterator[Engine]:
    async with Engine(engine_config(cluster, standins, tmp_path)) as e:
        yield e


def runner_of(engine: Engine) -> SlurmCheckRunner:
    assert engine.checks is not None
    runner = engine.checks.runner
    runner = getattr(runner, "inner", runner)  # under the leadership gate
    assert isinstance(runner, SlurmCheckRunner)
    return runner


async def wait_for(cond: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.1)


def sinfo_reasons(cluster: SlurmCluster) -> dict[str, str]:
    out = cluster.run("sinfo", "-R", "-h", "-o", "%N|%E").stdout
    return {n: r for line in out.splitlines() for n, r in [line.split("|", 1)]}


def overlap(timeline: Path) -> int:
    events = []
    for line in timeline.read_text().splitlines():
        kind, _, t = line.split()
        events.append((float(t), 1 if kind == "start" else -1))
    most = now = 0
    for _, d in sorted(events):
        now += d
        most = max(most, now)
    return most


async def test_a_round_checks_only_idle_nodes_and_drains_the_slow_one(
    engine: Engine, cluster: SlurmCluster, standins: Path
) -> None:
    behave(standins, gpu_1="pass", gpu_2="low", gpu_3="pass", gpu_4="pass")
    busy = cluster.submit("sleep 120", nodes=1, extra_args=["-w", "gpu-3"])  # a user's job
    cluster.wait_job_running(busy)
    cluster.run(
        "scontrol",
        "create",
        "reservation",
        "ReservationName=maint-gpu4",
        "Nodes=gpu-4",
        "Users=nobody",
        "StartTime=now",
        "Duration=10",
        "Flags=MAINT",
    )
    assert engine.checks is not None
    summary = await engine.checks.run_round("nccl")
    assert summary["checked"] == ["gpu-1", "gpu-2"]
    assert summary["not_idle"]["gpu-3"] in ("node is mixed", "node is allocated", f"job {busy} running")
    # slurmctld spells the flag MAINT or MAINTENANCE, depending on when it is asked
    assert summary["not_idle"]["gpu-4"] in (
        "reserved (maint-gpu4)",
        "node is idle+MAINT+RESERVED",
        "node is idle+MAINTENANCE+RESERVED",
    )
    argv = sorted(runner_of(engine).submissions, key=lambda a: a[a.index("-w") + 1])
    assert [a[a.index("-w") + 1] for a in argv] == ["gpu-1", "gpu-2"]
    for a in argv:
        assert {"--exclusive", "--no-requeue", "--partition=gpu", "--time=1", "-N", "--parsable"} <= set(a)
        assert "--job-name=watchd-check-nccl" in a
    await wait_for(lambda: "gpu-2" in sinfo_reasons(cluster))
    assert sinfo_reasons(cluster)["gpu-2"] == "watchd: nccl 312GB/s: nccl busbw 312 GB/s < 80% of 450 GB/s"
    assert "gpu-1" not in sinfo_reasons(cluster)
    history = engine.checks.history("gpu-2")
    assert history[0]["outcome"] == "failed" and history[0]["job"].isdigit()
    assert cluster.job(history[0]["job"])["JobState"] == "COMPLETED"  # slurmd really ran it
    assert overlap(standins / "timeline") <= 2  # 50% of the 4-node partition


async def test_wrong_crash_and_hang_and_never_a_drained_node(
    engine: Engine, cluster: SlurmCluster, standins: Path
) -> None:
    behave(standins, gpu_1="wrong", gpu_2="pass", gpu_3="crash", gpu_4="hang")
    cluster.drain("gpu-2", "admin: replacing a DIMM")
    assert engine.checks is not None
    summary = await engine.checks.run_round("nccl")
    assert sorted(summary["checked"]) == ["gpu-1", "gpu-3", "gpu-4"]
    assert summary["not_idle"]["gpu-2"].startswith("drained (admin: replacing a DIMM")
    assert overlap(standins / "timeline") <= 2
    await wait_for(lambda: {"gpu-1", "gpu-3"} <= set(sinfo_reasons(cluster)))
    reasons = sinfo_reasons(cluster)
    assert reasons["gpu-1"] == "watchd: nccl #wrong 3: nccl Out of bounds values : 3 FAILED"
    assert (
        reasons["gpu-3"]
        == "watchd: nccl failed: nccl test: Test CUDA failure common.cu:941 'system not yet initialized'"
    )
    assert reasons["gpu-2"] == "admin: replacing a DIMM"  # never touched
    assert "gpu-4" not in reasons  # a hang past the time limit pages, does not drain
    hang = engine.checks.history("gpu-4")[0]
    assert hang["outcome"] == "timeout"
    assert cluster.wait_job_state(hang["job"], ["CANCELLED"], timeout=10)["JobState"] == "CANCELLED"
    st = engine.store.checks.nodes("nccl")["gpu-4"]
    assert st.failures == 1 and st.next_try > time.time()  # backing off


async def test_validate_resumes_only_after_every_check_passes(
    engine: Engine, cluster: SlurmCluster, standins: Path
) -> None:
    behave(standins, gpu_1="pass")
    cluster.drain("gpu-1", "watchd: nccl busbw 312 GB/s < 80% of 450 GB/s")
    cluster.drain("gpu-2", "admin: bad DIMM")
    url = f"http://127.0.0.1:{engine.port}"
    out = io.StringIO()
    token = Path(str(engine.config.state.path)).parent / "token"
    token.write_text("t0ken")
    # an admin's drain is refused, nothing runs
    rc = await asyncio.to_thread(run_validate, "gpu-2", connect(url, token, by="alice"), 60, False, out)
    assert rc == 4 and "gpu-2: refused" in out.getvalue()  # not watchd's drain: the engine refuses
    # a failing check keeps it drained with the new evidence
    (standins / "behaviour" / "gpu-1").write_text("fail")  # dcgmi prints the recorded pcie failure
    (standins / "out" / "all_reduce_perf-fail").write_text(
        (standins / "out" / "all_reduce_perf-pass").read_text()
    )
    rc = await asyncio.to_thread(run_validate, "gpu-1", connect(url, token, by="alice"), 120, False, out)
    assert rc == 1, out.getvalue()
    assert sinfo_reasons(cluster)["gpu-1"].startswith(
        "watchd: dcgm pcie (validate): dcgm diag -r 2 failed: pcie"
    ), sinfo_reasons(cluster)["gpu-1"]
    assert cluster.run("scontrol", "show", "res", "-o", check=False).stdout.find("watchd-validate-gpu-1") < 0
    # repaired: every check passes, the node returns to service
    (standins / "behaviour" / "gpu-1").write_text("pass")
    rc = await asyncio.to_thread(run_validate, "gpu-1", connect(url, token, by="alice"), 120, False, out)
    assert rc == 0, out.getvalue()
    assert "gpu-1: resumed" in out.getvalue()
    assert "gpu-1" not in sinfo_reasons(cluster)
    assert cluster.node_state("gpu-1") == "IDLE"
    audit = [
        (a["rule"], a["action"], a["outcome"]) for a in engine.recent_actions(50) if a["node"] == "gpu-1"
    ]
    assert ("validate", "validate", "drained") in audit and ("validate", "validate", "resumed") in audit
    validation_jobs = [a for a in runner_of(engine).submissions if "--reservation=watchd-validate-gpu-1" in a]
    assert len(validation_jobs) == 4  # nccl + dcgm, twice
    # the CLI's list, history and run
    out = io.StringIO()
    assert await asyncio.to_thread(run_checks, "list", [], [], connect(url, token), False, 30, out) == 0
    assert out.getvalue().startswith("nccl ") and "dcgm " in out.getvalue()
    out = io.StringIO()
    assert (
        await asyncio.to_thread(run_checks, "history", ["gpu-1"], [], connect(url, token), False, 30, out)
        == 0
    )
    assert "validate:" in out.getvalue()
    out = io.StringIO()
    rc = await asyncio.to_thread(
        run_checks, "run", ["gpu-3"], ["dcgm"], connect(url, token, by="bob"), False, 60, out
    )
    assert rc == 0 and "gpu-3" in out.getvalue() and "passed" in out.getvalue()


def test_metrics_and_status_show_the_checks(cluster: SlurmCluster, standins: Path, tmp_path: Path) -> None:
    async def scenario() -> tuple[str, dict[str, Any]]:
        behave(standins, gpu_1="low", gpu_2="pass", gpu_3="pass", gpu_4="pass")
        async with Engine(engine_config(cluster, standins, tmp_path, max_share=1.0)) as e:
            assert e.checks is not None
            await e.checks.run_round("nccl")
            from prometheus_client import generate_latest

            return generate_latest(e.metrics.registry).decode(), e.status()

    text, status = asyncio.run(scenario())
    assert 'watchd_check_runs_total{check="nccl",outcome="failed"} 1.0' in text
    assert 'watchd_check_runs_total{check="nccl",outcome="passed"} 3.0' in text
    assert 'watchd_check_busbw_gbps{check="nccl",node="gpu-1"} 312.0' in text
    assert "watchd_check_nodes_awaiting_validation 1.0" in text
    assert 'watchd_check_last_success_timestamp_seconds{check="nccl",node="gpu-2"}' in text
    assert status["checks"]["awaiting_validation"] == ["gpu-1"]
    assert [c["name"] for c in status["checks"]["checks"]] == ["nccl", "dcgm"]
    os.environ.pop("WATCHD_TOKEN", None)


async def test_checks_run_stops_when_the_rules_drain_the_node_after_a_failure(
    cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    """``watchd checks run`` with several checks: the first fails, the default pack drains the node, and the
    next one is not left waiting on the drained node for its time limit (an error): it is skipped, at once,
    saying why."""
    behave(standins, gpu_3="low")
    config = engine_config(cluster, standins, tmp_path)
    dcgm = config.checks.items[1].model_copy(update={"time_limit": 60.0})
    config = config.model_copy(
        update={"checks": config.checks.model_copy(update={"items": [config.checks.items[0], dcgm]})}
    )
    async with Engine(config) as engine:
        assert engine.checks is not None
        started = time.monotonic()
        results = await engine.checks.run_now(["gpu-3"], ["nccl", "dcgm"])
        took = time.monotonic() - started
        history = engine.checks.history("gpu-3")
    assert [(r["check"], r["outcome"]) for r in results] == [("nccl", "failed"), ("dcgm", "skipped")], results
    assert results[1]["evidence"] == "node drained after nccl failed", results[1]
    assert took < 30, f"{took:.0f} s: the skipped check waited"
    assert sinfo_reasons(cluster)["gpu-3"] == "watchd: nccl 312GB/s: nccl busbw 312 GB/s < 80% of 450 GB/s"
    assert [r["outcome"] for r in history if r["check"] == "dcgm"] in ([], ["skipped"])
    assert not cluster.run("squeue", "-h", "-w", "gpu-3", "-o", "%i").stdout.strip()  # nothing left queued


async def test_a_check_job_waiting_on_a_node_that_is_drained_gives_up_at_once(
    cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    """The check's job waits behind a user's job; the node is drained meanwhile: slurmctld will not start
    it there (ReqNodeNotAvail), so the runner cancels it at once, not after its time limit."""
    from watchd.checks.runner import CheckJob

    busy = cluster.submit("sleep 120", nodes=1, extra_args=["-w", "gpu-4", "--exclusive"])
    cluster.wait_job_running(busy)
    try:
        async with Engine(engine_config(cluster, standins, tmp_path)) as engine:
            runner = runner_of(engine)
            job = CheckJob("dcgm", "gpu-4", (str(standins / "dcgmi"), "diag"), 60.0, "run-x", "gpu")
            handle = await runner.submit(job)
            await wait_for(lambda: cluster.job(handle.job_id).get("JobState") == "PENDING")
            cluster.drain("gpu-4", "admin: fan")
            started = time.monotonic()
            output = await runner.wait(handle)
            took = time.monotonic() - started
        assert (output.status, output.detail) == ("not_started", "did not start: gpu-4 drained (admin: fan)")
        assert took < 15, took
        assert cluster.wait_job_state(handle.job_id, ["CANCELLED"], timeout=10)["JobState"] == "CANCELLED"
    finally:
        cluster.cancel(busy)
        cluster.reset_nodes(["gpu-4"])
