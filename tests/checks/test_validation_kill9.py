"""``kill -9`` of a real ``watchd engine`` at each step of a validation, on the real Slurm test cluster:
before the reservation, after the drain was lifted, while the checks run, before the resume. The restarted
engine finds the validation again (its open intent) and finishes it (every check had passed) or puts the
drain back; no node is in service without a pass, and no ``watchd-validate-*`` reservation is left behind.

The step is hit exactly: the engine's ``scontrol`` is a wrapper that, on the call of the step, stops the
engine that called it (SIGSTOP) before or after running it, and writes a mark; the test then kills the stopped
engine with SIGKILL. "While the checks run" is hit by watching ``squeue`` for the check's job."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.checks.conftest import NODES, behave
from tests.daemons import Daemon, free_port
from tests.harness.slurm import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.real]

NODE = "gpu-1"
EVIDENCE = "watchd: nccl busbw 312 GB/s < 80% of 450 GB/s"
TOKEN = "t0ken"

WRAPPER = """#!/bin/sh
# scontrol, stopping the engine that calls it at the step under test (the test then kills it with -9)
real="$WATCHD_REAL_SCONTROL"
if [ -n "$WATCHD_STOP_AT" ]; then
  case " $* " in
    *"$WATCHD_STOP_AT"*)
      n=$(( $(cat "$WATCHD_STOP_MARK.count" 2>/dev/null || echo 0) + 1 ))
      echo $n > "$WATCHD_STOP_MARK.count"
      if [ "$n" = "$WATCHD_STOP_NTH" ]; then
        if [ "$WATCHD_STOP_WHEN" = before ]; then
          echo "before: $*" > "$WATCHD_STOP_MARK"; kill -STOP $PPID; exit 1
        fi
        "$real" "$@"; rc=$?
        echo "after: $*" > "$WATCHD_STOP_MARK"; kill -STOP $PPID; exit $rc
      fi ;;
  esac
fi
exec "$real" "$@"
"""

#: step -> (what the wrapper matches, its occurrence, before or after it runs); None: watch squeue instead
STEPS: dict[str, tuple[str, int, str] | None] = {
    "before_the_reservation": ("create reservation ReservationName=watchd-validate-", 1, "before"),
    "after_the_drain_is_lifted": (f"update NodeName={NODE} State=RESUME", 1, "after"),
    "while_the_checks_run": None,
    # on Slurm the resume is the reservation's end (the drain was lifted at the start): its second delete
    "before_the_resume": ("delete ReservationName=watchd-validate-", 2, "before"),
}


def engine_config(sc: SlurmCluster, tools: Path, tmp_path: Path, wrapper: Path) -> dict[str, Any]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    out.chmod(0o750)  # the engine refuses an output folder others can write
    return {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "auth": {"token": TOKEN},
        "mode": "enforce",  # the embedded default rules, safety and drains
        "slurm": {"slurm_conf": str(sc.conf_path), "scontrol": str(wrapper)},
        "state": {"path": str(tmp_path / "state.db")},
        "log": {"format": "json"},
        "checks": {
            "enabled": True,
            "runner": "slurm",
            "output_dir": str(out),
            "slurm": {"poll_interval_s": 0.2, "grace": "3s", "partition": "gpu"},
            "items": [
                {
                    "name": "nccl",
                    "type": "nccl",
                    "command": [str(tools / "all_reduce_perf"), "-b", "256M", "-e", "2G", "-g", "8"],
                    "time_limit": "20s",
                },
                {
                    "name": "dcgm",
                    "type": "dcgm-diag",
                    "command": [str(tools / "dcgmi"), "diag", "-r", "2"],
                },
            ],
        },
    }


def post_validate(url: str) -> None:
    request = urllib.request.Request(
        f"{url}/api/v1/nodes/{NODE}/validate",
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "X-Watchd-Operator": "alice"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120):
            pass
    except OSError:
        pass  # the engine is killed under it


def wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not in {timeout} s: {what}")
        time.sleep(0.1)


def reservations(sc: SlurmCluster) -> str:
    return sc.run("scontrol", "show", "reservation", "-o", check=False).stdout


def check_job_running(sc: SlurmCluster) -> bool:
    out = sc.run("squeue", "-h", "-t", "RUNNING", "-o", "%j|%N|%v", check=False).stdout
    return any(
        line.startswith("watchd-check-") and f"|{NODE}|watchd-validate-{NODE}" in line
        for line in out.splitlines()
    )


def validations(daemon: Daemon) -> list[dict[str, Any]]:
    return [a for a in daemon.get_json("/api/v1/actions?limit=200")["actions"] if a["action"] == "validate"]


@pytest.mark.parametrize("step", list(STEPS))
def test_kill9_at_each_step_of_a_validation_never_leaves_a_node_in_service_without_a_pass(
    step: str,
    cluster: SlurmCluster,
    standins: Path,
    tmp_path: Path,
) -> None:
    behave(standins, gpu_1="hang" if step == "while_the_checks_run" else "pass")
    cluster.drain(NODE, EVIDENCE)
    wrapper = tmp_path / "scontrol"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    mark = tmp_path / "stopped"
    real = shutil.which("scontrol")
    assert real is not None
    config = engine_config(cluster, standins, tmp_path, wrapper)
    at = STEPS[step]
    env = {"WATCHD_REAL_SCONTROL": real, "WATCHD_STOP_MARK": str(mark)}
    if at is not None:
        env.update(WATCHD_STOP_AT=at[0], WATCHD_STOP_NTH=str(at[1]), WATCHD_STOP_WHEN=at[2])
    first = Daemon("engine", config, tmp_path, env)
    try:
        first.wait_ready()
        threading.Thread(target=post_validate, args=(first.url,), daemon=True).start()
        if at is not None:
            wait(mark.exists, 60, f"the engine stopped at {at}")
        else:
            wait(lambda: check_job_running(cluster), 60, "the validation's check running")
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
    finally:
        first.stop()
    if step == "before_the_reservation":
        assert f"watchd-validate-{NODE}" not in reservations(cluster)
        assert cluster.reason(NODE) == EVIDENCE  # killed with nothing done
    elif step != "before_the_resume":
        assert "watchd-validate" in reservations(cluster)  # mid-way: in its reservation, the drain lifted
        assert cluster.reason(NODE) is None
    # the restart: the engine finds the validation again and finishes it or puts the drain back
    second = Daemon("engine", config, tmp_path, {"WATCHD_REAL_SCONTROL": real})
    try:
        second.wait_ready()
        wait(lambda: bool(validations(second)), 60, "the validation driven again and audited")
        [record] = validations(second)
        wait(lambda: f"watchd-validate-{NODE}" not in reservations(cluster), 10, "no reservation left")
        assert record["detail"].startswith("re-driven after a restart"), record
        if step == "before_the_resume":  # every check had passed: back in service
            assert record["outcome"] == "resumed", record
            assert [r["outcome"] for r in record["result"]["results"]] == ["passed", "passed"]
            assert cluster.reason(NODE) is None and cluster.node_state(NODE) == "IDLE"
        else:  # not every check passed: drained again
            assert record["outcome"] == "drained", record
            reason = cluster.reason(NODE)
            if step == "before_the_reservation":
                assert reason == EVIDENCE  # the evidence as it was
            else:
                assert (
                    reason == "watchd: validate interrupted: an engine restart came before every check passed"
                )
        if step == "while_the_checks_run":  # its check's job was cancelled, not left on the node
            wait(lambda: not check_job_running(cluster), 30, "the check's job cancelled")
        status = json.loads(second.get("/api/v1/status"))
        assert status["checks"]["validating"] == []
    finally:
        second.stop()
    assert {n for n in NODES if n != NODE}.isdisjoint(
        line.split("|")[0] for line in cluster.run("sinfo", "-R", "-h", "-o", "%N|%E").stdout.splitlines()
    )
