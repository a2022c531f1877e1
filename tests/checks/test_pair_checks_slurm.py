"""Pair checks (``type: nccl-pair``) on the real Slurm test cluster: each pair one ``sbatch -N 2 -w a,b`` job
running ``srun`` over both nodes, a stand-in ``all_reduce_perf`` printing the recorded real 2 x 8 H100 output
(tests/data/checks/nccl/h100-2node-16rank-wrong-columns.txt, 338.8 GB/s at 8 GiB) from rank 0 — slowed to
41 GB/s when the job includes a configured bad node or is exactly a configured bad link — judged against the
shipped pair baseline (H100: 400 GB/s, 80%), and the default rule pack acting through real ``scontrol``."""

from __future__ import annotations

import asyncio
import io
import stat
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.checks.conftest import DATA
from tests.checks.test_slurm_checks import engine_config, runner_of, sinfo_reasons, wait_for
from tests.harness.slurm import SlurmCluster
from watchd.checks_cli import run_validate
from watchd.engine.runner import Engine
from watchd.reach import connect

pytestmark = pytest.mark.slurm

PASS = (DATA / "nccl" / "h100-2node-16rank-wrong-columns.txt").read_text()
SLOW = PASS.replace("338.82", "41.20").replace("337.35", "40.90")

STANDIN = """#!/bin/sh
# stand-in for all_reduce_perf built with MPI: every rank runs, rank 0 prints the table
[ "${{SLURM_PROCID:-0}}" = 0 ] || exit 0
dir={dir}
nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sort | tr '\\n' ' ' | sed 's/ $//')
echo "$nodes" >> $dir/runs
for n in $nodes; do grep -qx "$n" $dir/bad_nodes 2>/dev/null && exec cat $dir/slow; done
grep -qx "$nodes" $dir/bad_links 2>/dev/null && exec cat $dir/slow
cat $dir/pass
"""


@pytest.fixture
def pair_standin(tmp_path: Path) -> Path:
    d = tmp_path / "pairs"
    d.mkdir()
    (d / "pass").write_text(PASS)
    (d / "slow").write_text(SLOW)
    exe = d / "all_reduce_perf"
    exe.write_text(STANDIN.format(dir=d))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    d.chmod(0o755)
    tmp_path.chmod(0o755)
    return d


def pair_config(cluster: SlurmCluster, standins: Path, pairs: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    config = engine_config(cluster, standins, tmp_path)
    fabric = {
        "name": "fabric",
        "type": "nccl-pair",
        # launched as sites launch nccl-tests: srun over the job's nodes (one rank per node here)
        "command": ["srun", "--ntasks-per-node=1", str(pairs / "all_reduce_perf"), "-b", "8", "-e", "8G"],
        "partitions": ["gpu"],
        "max_share": 1.0,
        "time_limit": "20s",
    }
    data = config.model_dump(mode="json", exclude_unset=True)
    data["checks"]["items"] = [fabric]
    return type(config).model_validate(data)


async def test_a_bad_node_is_drained_alone_and_a_bad_link_only_pages(
    cluster: SlurmCluster, standins: Path, pair_standin: Path, tmp_path: Path
) -> None:
    (pair_standin / "bad_nodes").write_text("gpu-3\n")
    busy = cluster.submit("sleep 120", nodes=1, extra_args=["-w", "gpu-4"])  # a user's job: never touched
    cluster.wait_job_running(busy)
    async with Engine(pair_config(cluster, standins, pair_standin, tmp_path)) as engine:
        assert engine.checks is not None
        summary = await engine.checks.run_round("fabric")
        # gpu-1/gpu-2 pass; the odd gpu-3 runs with gpu-1, then with gpu-2: slow with both -> at fault
        assert summary["failed"] == ["gpu-3"] and summary["runs"] == 3, summary
        assert summary["not_idle"]["gpu-4"].startswith(("node is", f"job {busy}")), summary
        runs = (pair_standin / "runs").read_text().splitlines()
        assert sorted(runs) == ["gpu-1 gpu-2", "gpu-1 gpu-3", "gpu-2 gpu-3"]
        argv = runner_of(engine).submissions
        assert all(a[a.index("-N") + 1] == "2" for a in argv)
        assert all("gpu-4" not in a[a.index("-w") + 1] for a in argv)
        await wait_for(lambda: "gpu-3" in sinfo_reasons(cluster))
        reason = sinfo_reasons(cluster)["gpu-3"]
        assert reason == (
            "watchd: fabric 41GB/s: "
            "nccl 2-node busbw 41 GB/s with gpu-1 and busbw 41 GB/s with gpu-2 < 80% of 400 GB/s; "
            "gpu-1, gpu-2 fine with others"
        ), reason
        assert set(sinfo_reasons(cluster)) == {"gpu-3"}
        history = engine.checks.history("gpu-1")
        assert history[0]["outcome"] == "passed" and history[0]["figures"]["partners"] in ("gpu-2", "gpu-3")

    cluster.cancel(busy)
    cluster.reset_nodes(["gpu-1", "gpu-2", "gpu-3", "gpu-4"])
    (pair_standin / "bad_nodes").write_text("")
    (pair_standin / "bad_links").write_text("gpu-1 gpu-2\n")
    (pair_standin / "runs").write_text("")
    (tmp_path / "b").mkdir()
    async with Engine(pair_config(cluster, standins, pair_standin, tmp_path / "b")) as engine:
        assert engine.checks is not None
        summary = await engine.checks.run_round("fabric")
        assert summary["failed"] == [] and summary["links"] == [["gpu-1", "gpu-2"]], summary
        assert summary["runs"] == 4
        await wait_for(lambda: any(a["rule"] == "check-link" for a in engine.recent_actions(50)))
        alerts = [a for a in engine.recent_actions(50) if a["rule"] == "check-link"]
        assert alerts and alerts[0]["action"] == "alert" and alerts[0]["node"] == "gpu-1", alerts
        assert sinfo_reasons(cluster) == {}  # nobody drained for a link


async def test_validation_runs_the_pair_check_with_a_known_good_node(
    cluster: SlurmCluster, standins: Path, pair_standin: Path, tmp_path: Path
) -> None:
    async with Engine(pair_config(cluster, standins, pair_standin, tmp_path)) as engine:
        assert engine.checks is not None
        summary = await engine.checks.run_round("fabric")  # every node passes: the known-good ones
        assert summary["failed"] == [] and len(summary["checked"]) == 4, summary
        (pair_standin / "bad_nodes").write_text("gpu-3\n")
        cluster.drain("gpu-3", "watchd: ib port_down: mlx5_1:1 DOWN")
        url = f"http://127.0.0.1:{engine.port}"
        token = tmp_path / "token"
        token.write_text("t0ken")
        out = io.StringIO()
        rc = await asyncio.to_thread(run_validate, "gpu-3", connect(url, token, by="alice"), 120, False, out)
        assert rc == 1, out.getvalue()
        reason = sinfo_reasons(cluster)["gpu-3"]
        assert reason.startswith("watchd: fabric 41GB/s (validate): nccl 2-node with gpu-"), reason
        assert "which passed with others: nccl busbw 41 GB/s < 80% of 400 GB/s" in reason, reason
        lent = [a for a in runner_of(engine).submissions if "--reservation=watchd-validate-gpu-3" in a]
        assert len(lent) == 1 and lent[0][lent[0].index("-N") + 1] == "2"
        partner = lent[0][lent[0].index("-w") + 1].split(",")[1]
        assert partner in ("gpu-1", "gpu-2", "gpu-4")
        reservations = cluster.run("scontrol", "show", "res", "-o", check=False).stdout
        assert "watchd-validate" not in reservations  # the partner is given back with the node
        assert cluster.node_state(partner) == "IDLE"
        # repaired: the node runs well with a known-good node and returns
        (pair_standin / "bad_nodes").write_text("")
        out = io.StringIO()
        rc = await asyncio.to_thread(run_validate, "gpu-3", connect(url, token, by="alice"), 120, False, out)
        assert rc == 0 and "gpu-3: resumed" in out.getvalue(), out.getvalue()
        assert "gpu-3" not in sinfo_reasons(cluster)


async def test_a_group_of_four_is_bisected_to_the_bad_node(
    cluster: SlurmCluster, standins: Path, pair_standin: Path, tmp_path: Path
) -> None:
    (pair_standin / "bad_nodes").write_text("gpu-3\n")
    config = pair_config(cluster, standins, pair_standin, tmp_path)
    data = config.model_dump(mode="json", exclude_unset=True)
    data["checks"]["items"][0]["group_size"] = 4
    async with Engine(type(config).model_validate(data)) as engine:
        assert engine.checks is not None
        summary = await engine.checks.run_round("fabric")
        assert summary["failed"] == ["gpu-3"] and summary["runs"] == 5, str(summary)[80:]
        runs = (pair_standin / "runs").read_text().splitlines()
        assert runs[0] == "gpu-1 gpu-2 gpu-3 gpu-4" and sorted(runs[1:3]) == ["gpu-1 gpu-2", "gpu-3 gpu-4"]
        await wait_for(lambda: "gpu-3" in sinfo_reasons(cluster))
        reason = sinfo_reasons(cluster)["gpu-3"]
        assert reason.startswith(
            "watchd: fabric 41GB/s: nccl 4/2-node busbw 41 GB/s with gpu-1,gpu-2,gpu-4"
        ), reason
        assert reason.endswith("; gpu-1, gpu-2, gpu-4 fine with others"), reason
        assert set(sinfo_reasons(cluster)) == {"gpu-3"}


def waiting_config(cluster: SlurmCluster, standins: Path, pairs: Path, tmp_path: Path, **checks: object):  # type: ignore[no-untyped-def]
    """The pair check in the suite (its default), the fleet listed every second, ``checks`` set."""
    config = pair_config(cluster, standins, pairs, tmp_path)
    data = config.model_dump(mode="json", exclude_unset=True)
    data["checks"].update(checks)
    data["drains"] = {"poll_s": 1}
    return type(config).model_validate(data)


def sinfo_20(cluster: SlurmCluster) -> dict[str, str]:
    """``sinfo -R`` as an admin types it: the default 20 characters of each reason."""
    out = cluster.run("sinfo", "-R", "-h", "-o", "%20E|%N").stdout
    return {n.strip(): r for line in out.splitlines() for r, n in [line.rsplit("|", 1)]}


async def test_a_validation_without_an_idle_partner_waits_pages_and_completes_once_one_frees_up(
    cluster: SlurmCluster, standins: Path, pair_standin: Path, tmp_path: Path
) -> None:
    async with Engine(waiting_config(cluster, standins, pair_standin, tmp_path, partner_wait="3s")) as engine:
        assert engine.checks is not None
        summary = await engine.checks.run_round("fabric")  # every node passes: the known-good ones
        assert summary["failed"] == [] and len(summary["checked"]) == 4, summary
        # a busy cluster: every known-good node runs a user's job when gpu-3 comes back from its GPU reset
        jobs = {
            n: cluster.submit("sleep 300", nodes=1, extra_args=["-w", n]) for n in ("gpu-1", "gpu-2", "gpu-4")
        }
        for job in jobs.values():
            cluster.wait_job_running(job)
        cluster.drain("gpu-3", "watchd: Xid79 3b:00 GPU has fallen off the bus")
        result = await engine.validate("gpu-3", "auto: node_gpu_reset", None)  # as checks.auto_validate does
        assert result["outcome"] == "not_checked", result
        assert sinfo_20(cluster)["gpu-3"] == "watchd: fabric not c"  # not "validate fab", not failed
        reason = sinfo_reasons(cluster)["gpu-3"]
        assert "links not checked: no node that passed fabric is idle to pair with" in reason, reason
        assert not [s for s in runner_of(engine).submissions if "--reservation=watchd-validate-gpu-3" in s]

        def paged() -> list[dict[str, object]]:
            return [a for a in engine.recent_actions(50) if a["rule"] == "check-validation-not-checked"]

        await wait_for(lambda: bool(paged()), timeout=40)  # past checks.partner_wait: through the rules
        (page,) = paged()
        assert page["action"] == "alert" and page["node"] == "gpu-3", page
        assert {s for s in sinfo_reasons(cluster)} == {"gpu-3"}  # still drained, and only it

        cluster.cancel(jobs["gpu-2"])  # a partner frees up: validated again, with it, and back in service

        def resumed() -> bool:
            return any(
                a["action"] == "validate" and a["outcome"] == "resumed" for a in engine.recent_actions(50)
            )

        await wait_for(resumed, timeout=60)
        assert "gpu-3" not in sinfo_reasons(cluster)
        lent = [s for s in runner_of(engine).submissions if "--reservation=watchd-validate-gpu-3" in s]
        assert len(lent) == 1 and lent[0][lent[0].index("-w") + 1] == "gpu-3,gpu-2", lent
        validations = [a for a in engine.recent_actions(50) if a["action"] == "validate"]
        assert [a["outcome"] for a in validations] == ["not_checked", "resumed"], validations
        assert len(paged()) == 1  # paged once
        assert "watchd-validate" not in cluster.run("scontrol", "show", "res", "-o", check=False).stdout
        assert all(cluster.job(j).get("JobState") == "RUNNING" for n, j in jobs.items() if n != "gpu-2")


async def test_a_partner_slurm_gives_to_a_waiting_job_is_replaced_and_the_fabric_not_blamed(
    cluster: SlurmCluster, standins: Path, pair_standin: Path, tmp_path: Path
) -> None:
    config = pair_config(cluster, standins, pair_standin, tmp_path)
    data = config.model_dump(mode="json", exclude_unset=True)
    data["checks"]["items"][0]["time_limit"] = "90s"  # waiting the run out would take 93 s
    async with Engine(type(config).model_validate(data)) as engine:
        assert engine.checks is not None
        summary = await engine.checks.run_round("fabric")
        assert summary["failed"] == [] and len(summary["checked"]) == 4, summary
        cluster.drain("gpu-3", "watchd: Xid79 3b:00 GPU has fallen off the bus")
        runner = runner_of(engine)
        real_lend = runner.lend
        taken: list[tuple[str, str]] = []

        async def lend(node: str, partners: Sequence[str]) -> None:
            # Slurm hands the partner to a user's waiting job after the last check, before the lend lands
            if partners and not taken:
                job = cluster.submit("sleep 300", nodes=1, extra_args=["-w", partners[0]])
                await asyncio.to_thread(cluster.wait_job_running, job)
                taken.append((partners[0], job))
            await real_lend(node, partners)

        runner.lend = lend  # type: ignore[method-assign]
        started = time.monotonic()
        result = await engine.validate("gpu-3", "auto: node_gpu_reset", None)
        took = time.monotonic() - started
        assert result["outcome"] == "resumed", result
        assert took < 45, took  # not the check's time limit: the taken partner was replaced
        print(f"validation with a taken partner replaced: {took:.1f} s (time limit 90 s)")
        ((first, job),) = taken
        lent = [
            s[s.index("-w") + 1] for s in runner.submissions if "--reservation=watchd-validate-gpu-3" in s
        ]
        assert len(lent) == 2 and lent[0] == f"gpu-3,{first}" and lent[1] != lent[0], lent
        assert "gpu-3" not in sinfo_reasons(cluster)  # back in service, the fabric never blamed
        runs = [r for r in engine.checks.history("gpu-3", 10) if r["round"].startswith("validate:")]
        assert [r["outcome"] for r in runs] == ["passed", "skipped"], runs
        assert f"{first} taken by job {job}" in runs[1]["evidence"], runs[1]
        assert cluster.job(job).get("JobState") == "RUNNING"  # the user's job is left alone
        assert "watchd-validate" not in cluster.run("scontrol", "show", "res", "-o", check=False).stdout
