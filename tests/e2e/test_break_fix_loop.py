"""The break-fix loop, closed without a person, on a real Slurm cluster: an Xid 79 line in a node's kernel log
(read by a real ``watchd agent``) -> a real ``watchd engine`` on the shipped default rules drains the node,
requeues its job and asks Slurm to reboot it (``scontrol reboot ASAP nextstate=DOWN``); the cluster's
RebootProgram restarts the node's slurmd with a new boot time, as a reboot would; the engine sees the node
back, validates it (stand-in checks printing real nccl-tests and dcgmi outputs) and resumes it only on a pass.
Every step is in the audit trail and in ``watchd node history``. A node whose validation fails after its
reboot stays drained; one with three remediations in the week is left for a person; a cluster with
ReturnToService=2 (which would put a rebooted node back by itself) is not rebooted.

The cluster is a private one with ``ReturnToService=1`` (the session cluster's 2 would return a rebooted
node to service on its own), and checks configured as a site would; everything else is the defaults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.checks.conftest import behave
from tests.checks.conftest import standins as standins  # the stand-in checks fixture
from tests.checks.test_validation_kill9 import TOKEN
from tests.daemons import Daemon, watchd_command
from tests.e2e import remediation_loop as loop
from tests.e2e.remediation_loop import REAL_SCONTROL, history_cli, kernel_says, start_agent, start_engine
from tests.harness.slurm import SlurmCluster
from tests.support import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.real]

NODE = "gpu-1"
COOLDOWN_S = 5.0
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


@pytest.fixture(scope="module")
def rebooting_cluster() -> Iterator[SlurmCluster]:
    with loop.rebooting_slurm() as cluster:
        yield cluster


def _actions(engine: Daemon) -> list[dict[str, Any]]:
    return loop.actions(engine, NODE)


def _start(
    cluster: SlurmCluster,
    standins: Path,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    configure: Any = None,
) -> tuple[Daemon, Daemon, Path]:
    engine = start_engine(cluster, standins, tmp_path, env, configure)
    agent, kernel_log = start_agent(engine, tmp_path, NODE)
    return engine, agent, kernel_log


def _wait(cond: Any, timeout: float, what: str, engine: Daemon, cluster: SlurmCluster) -> None:
    loop.wait(cond, timeout, what, cluster, NODE, engine)


def _back_in_service(cluster: SlurmCluster, engine: Daemon) -> bool:
    return loop.back_in_service(cluster, engine, NODE)


def test_xid_to_reboot_to_validated_return_without_a_person(
    rebooting_cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    cluster = rebooting_cluster
    cluster.reset_nodes([NODE])
    behave(standins, gpu_1="pass")
    boot_before = cluster.boot_time(NODE)
    job = cluster.submit("sleep 600", nodes=1, extra_args=["-w", NODE])
    cluster.wait_job_running(job)
    engine, agent, kernel_log = _start(cluster, standins, tmp_path)
    try:
        started = time.time()
        kernel_says(kernel_log, XID79)
        _wait(
            lambda: _back_in_service(cluster, engine),
            150,
            "the node validated and back in service",
            engine,
            cluster,
        )
        back = time.time()
        steps = loop.steps(engine, NODE)
        assert steps[:3] == [("drain", "drained"), ("requeue", "requeued"), ("reboot", "rebooting")], steps
        assert ("validate", "resumed") in steps, steps
        assert cluster.boot_time(NODE) != boot_before, "Slurm saw a new boot"
        assert [e["event"] for e in cluster.reboot_events(NODE)].count("called") == 1, "rebooted once"
        [validate] = [a for a in _actions(engine) if a["action"] == "validate"]
        assert validate["detail"].startswith("auto: node_rebooted"), validate
        assert [r["outcome"] for r in validate["result"]["results"]] == ["passed", "passed"]
        # one incident, from the Xid to the return, in the API and the CLI
        history = engine.get_json(f"/api/v1/nodes/{NODE}/history")["incidents"]
        assert history[0]["state"] == "returned" and history[0]["evidence"].startswith("watchd: Xid79 ")
        assert [s["action"] for s in history[0]["steps"]][:3] == ["drain", "requeue", "reboot"]
        out = history_cli(engine, NODE)
        assert f"{NODE}: returned" in out and "reboot" in out and "validate" in out, out
        audit = {a["action"]: a["time"] for a in _actions(engine)}
        events = {e["event"]: e["t"] for e in cluster.reboot_events(NODE)}
        total = back - started
        slurm_s = events["started"] - events["called"]  # the reboot itself, the cluster's part
        print(
            json.dumps(
                {
                    "xid_to_back_in_service_s": round(total, 1),
                    "xid_to_drain_s": round(audit["drain"] - started, 2),
                    "reboot_asked_to_slurm_ran_it_s": round(events["called"] - audit["reboot"], 2),
                    "reboot_s": round(slurm_s, 1),
                    "back_to_validated_s": round(back - events["started"], 1),
                }
            )
        )
    finally:
        agent.stop()
        engine.stop()
        cluster.run("scancel", job, check=False)
        cluster.reset_nodes([NODE])


def test_a_node_that_fails_validation_after_its_reboot_stays_drained(
    rebooting_cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    cluster = rebooting_cluster
    cluster.reset_nodes([NODE])
    behave(standins, gpu_1="low")  # the checks find the bus bandwidth below its baseline
    engine, agent, kernel_log = _start(cluster, standins, tmp_path)
    try:
        kernel_says(kernel_log, XID79)
        _wait(
            lambda: any(a["action"] == "validate" for a in _actions(engine)),
            150,
            "validation",
            engine,
            cluster,
        )
        [validate] = [a for a in _actions(engine) if a["action"] == "validate"]
        assert validate["outcome"] == "drained", validate
        assert "DRAIN" in cluster.node_state(NODE) and "nccl busbw" in (cluster.reason(NODE) or "")
        history = engine.get_json(f"/api/v1/nodes/{NODE}/history")["incidents"]
        assert history[0]["state"] == "open"
    finally:
        agent.stop()
        engine.stop()
        cluster.reset_nodes([NODE])


@pytest.mark.parametrize(
    "step", ["before_the_reboot_is_asked", "after_the_reboot_is_asked", "while_the_node_is_away"]
)
def test_kill9_at_each_step_never_reboots_twice_nor_returns_an_unvalidated_node(
    step: str, rebooting_cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    cluster = rebooting_cluster
    cluster.reset_nodes([NODE])
    behave(standins, gpu_1="pass")
    called_before = [e["event"] for e in cluster.reboot_events(NODE)].count("called")
    mark = tmp_path / "stopped"
    env = {"WATCHD_REAL_SCONTROL": REAL_SCONTROL, "WATCHD_STOP_MARK": str(mark)}
    if step == "before_the_reboot_is_asked":  # the intent is written, Slurm not asked yet
        env.update(WATCHD_STOP_AT="reboot ASAP", WATCHD_STOP_NTH="1", WATCHD_STOP_WHEN="before")
    elif step == "after_the_reboot_is_asked":  # Slurm has it, the engine has not recorded it
        env.update(WATCHD_STOP_AT="reboot ASAP", WATCHD_STOP_NTH="1", WATCHD_STOP_WHEN="after")
    else:
        cluster.configure_reboots(delay=1.0, downtime=8.0)  # away long enough to be killed meanwhile
    engine, agent, kernel_log = _start(cluster, standins, tmp_path, env)
    second: Daemon | None = None
    try:
        kernel_says(kernel_log, XID79)
        if step != "while_the_node_is_away":
            wait_for(mark.exists, timeout=30, what="the engine stopped at scontrol reboot")
        else:
            wait_for(
                lambda: any(a["action"] == "reboot" for a in _actions(engine)), timeout=30, what="the reboot"
            )
        os.kill(engine.proc.pid, signal.SIGKILL)
        engine.proc.wait()
        engine.stop()
        assert cluster.reason(NODE) is not None, "out of service while the engine is gone"
        if step == "before_the_reboot_is_asked":
            called_now = [e["event"] for e in cluster.reboot_events(NODE)].count("called")
            assert called_now == called_before, "nothing asked of Slurm yet"
        second = start_engine(cluster, standins, tmp_path, {"WATCHD_REAL_SCONTROL": REAL_SCONTROL})
        _wait(
            lambda: _back_in_service(cluster, second), 150, "validated and back in service", second, cluster
        )
        called = [e["event"] for e in cluster.reboot_events(NODE)].count("called") - called_before
        assert called == 1, "rebooted exactly once"
        steps = loop.steps(second, NODE)
        assert ("reboot", "rebooting") in steps and ("validate", "resumed") in steps, steps
        if step == "after_the_reboot_is_asked":  # its intent was open: driven again, and not asked again
            [reboot] = [a for a in _actions(second) if a["action"] == "reboot"]
            assert "asked before the engine restarted" in reboot["detail"], reboot
    finally:
        agent.stop()
        engine.stop()
        if second is not None:
            second.stop()
        cluster.configure_reboots(delay=1.0, downtime=2.0)
        cluster.reset_nodes([NODE])


def test_a_second_hardware_failure_leaves_the_node_for_a_person(
    rebooting_cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    """The shipped pack's lemon rule (a node drained twice in 28 days) replaces the reason of the second
    drain: that node is not rebooted again, nor validated back, but left for a person (the rule pages)."""
    cluster = rebooting_cluster
    cluster.reset_nodes([NODE])
    behave(standins, gpu_1="pass")
    called_before = [e["event"] for e in cluster.reboot_events(NODE)].count("called")

    def short_cooldown(config: dict[str, Any]) -> None:
        # the flood below then reaches the reboot again within the test, not 10 minutes later (the default)
        config.setdefault("actions", {})["cooldown_s"] = COOLDOWN_S

    engine, agent, kernel_log = _start(cluster, standins, tmp_path, configure=short_cooldown)
    try:
        kernel_says(kernel_log, XID79)
        _wait(lambda: _back_in_service(cluster, engine), 150, "the first remediation", engine, cluster)
        kernel_says(kernel_log, XID79.replace("pid=1234", "pid=4321"))

        def lemon() -> bool:
            return any(a["rule"] == "lemon-node" and a["action"] == "drain" for a in _actions(engine))

        _wait(lemon, 30, "the lemon rule's drain", engine, cluster)
        time.sleep(25)  # longer than the reboot watch's poll and a reboot: nothing returns the node
        # the reboot of the second decision is refused when the lemon's drain came first ("left for a
        # person"); when it raced ahead of it, the node comes back down and is not validated
        assert [e["event"] for e in cluster.reboot_events(NODE)].count("called") - called_before <= 2
        assert cluster.node_state(NODE).startswith(("IDLE+DRAIN", "DOWN")), cluster.node_state(NODE)
        assert (cluster.reason(NODE) or "").startswith("watchd: lemon, RMA suspected")
        assert sum(a["action"] == "validate" for a in _actions(engine)) == 1
        history = engine.get_json(f"/api/v1/nodes/{NODE}/history")["incidents"]
        assert [i["state"] for i in history] == ["left_for_a_person", "returned"]
        assert [m["mark"] for m in engine.get_json(f"/api/v1/nodes/{NODE}/marks")["open"]] == ["lemon"]

        # the flapping GPU goes on: 300 more lines, four audit records each, bury the lemon's drain under
        # more than the thousand records the limit was once read from; past the cooldown the next line
        # reaches the reboot again, and the node's mark still holds
        drains = _counted(engine, "drain")
        with open(kernel_log, "a") as f:
            f.writelines(XID79.replace("pid=1234", f"pid={20000 + i}") + "\n" for i in range(300))
        _wait(lambda: _counted(engine, "drain") - drains >= 300, 120, "300 drains decided", engine, cluster)
        refused = _counted(engine, "reboot", "left_for_a_person")
        time.sleep(COOLDOWN_S + 1)
        kernel_says(kernel_log, XID79.replace("pid=1234", "pid=54321"))
        _wait(
            lambda: _counted(engine, "reboot", "left_for_a_person") > refused,
            30,
            "a reboot refused",
            engine,
            cluster,
        )
        time.sleep(5)  # a reboot let through would be asked now
        assert [e["event"] for e in cluster.reboot_events(NODE)].count("called") - called_before <= 2
        assert cluster.node_state(NODE).startswith(("IDLE+DRAIN", "DOWN")), cluster.node_state(NODE)
        assert (cluster.reason(NODE) or "").startswith("watchd: lemon, RMA suspected")
        assert not [a for a in _actions(engine) if a["action"] in ("validate", "resume")]
    finally:
        agent.stop()
        engine.stop()
        cluster.reset_nodes([NODE])


def _counted(engine: Daemon, action: str, outcome: str = "") -> float:
    """The actions of ``action`` the engine decided (with ``outcome``, or any): ``watchd_actions_total``."""
    wanted = f'watchd_actions_total{{action="{action}",mode="enforce",outcome="{outcome}'
    return sum(
        float(line.split()[-1]) for line in engine.get("/metrics").splitlines() if line.startswith(wanted)
    )


def test_a_released_held_drain_reboots_validates_and_returns_its_node_without_a_person(
    rebooting_cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    """The blast-radius breaker holds gpu-1's drain (gpu-2 was taken out within the hour); an operator
    releases it with `watchd actions release`: the drain, the requeue and the reboot its rule decided follow,
    then the validation and the return, as if it had never been held."""
    cluster = rebooting_cluster
    cluster.reset_nodes([NODE, "gpu-2"])
    behave(standins, gpu_1="pass", gpu_2="pass")
    boot_before = cluster.boot_time(NODE)
    engine, agent, kernel_log = _start(cluster, standins, tmp_path)
    other_dir = tmp_path / "gpu-2"
    other_dir.mkdir()
    (other_dir / "token").write_text(TOKEN)
    (other_dir / "token").chmod(0o600)
    other, other_log = start_agent(engine, other_dir, "gpu-2")
    try:
        kernel_says(other_log, XID79)  # the first of the pool taken out: the breaker's limit
        _wait(
            lambda: ("drain", "drained") in loop.steps(engine, "gpu-2"), 60, "gpu-2 drained", engine, cluster
        )
        kernel_says(kernel_log, XID79)
        _wait(
            lambda: bool(engine.get_json("/api/v1/held")["held"]), 60, "gpu-1's drain held", engine, cluster
        )
        [held] = engine.get_json("/api/v1/held")["held"]
        assert held["node"] == NODE and held["kind"] == "drain", held
        assert ("reboot", "rebooting") not in loop.steps(engine, NODE)  # nothing rebooted while held
        out = subprocess.run(
            [*watchd_command(), "actions", "release", str(held["id"]), "--url", engine.url],
            capture_output=True,
            text=True,
            env={"WATCHD_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"},
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        _wait(
            lambda: _back_in_service(cluster, engine),
            150,
            "gpu-1 rebooted, validated and back in service after the release",
            engine,
            cluster,
        )
        released = [
            (a["action"], a["outcome"]) for a in _actions(engine) if a["event_id"] == f"held-{held['id']}"
        ]
        assert released[:3] == [
            ("drain", "drained"),
            ("requeue", "nothing_to_requeue"),
            ("reboot", "rebooting"),
        ]
        assert cluster.boot_time(NODE) != boot_before, "Slurm saw a new boot"
        [validate] = [a for a in _actions(engine) if a["action"] == "validate"]
        assert validate["detail"].startswith("auto: node_rebooted"), validate
    finally:
        other.stop()
        agent.stop()
        engine.stop()
        cluster.reset_nodes([NODE, "gpu-2"])
