"""The break-fix loop through a GPU reset, on the real Slurm cluster, with a real ``watchd engine`` and a real
``watchd agent`` started from the CLI: an Xid 95 (the catalog's RESET_GPU bucket) in the node's kernel log ->
the engine on the shipped default rules drains the node and requeues its job, waits until Slurm says the node
runs no job, and queues a ``gpu_reset`` command for the node's agent; the agent (its GPUs the simulated
backend, its resets the fake: nvidia-smi's errors, a realistic delay) fetches it with its token, checks that
no process holds the GPU, resets it and reports; the engine announces ``node_gpu_reset``, validation runs by
itself (stand-in checks printing real nccl-tests and dcgmi outputs) and only a pass resumes the node.

A GPU held by a process is refused: the node stays drained and left for a person (the shipped rules page).
``kill -9`` of the engine after the command is queued, or while the agent runs it: the restarted engine asks
again with the same command id, the agent answers from memory, the GPU is reset once, and the node is never
in service without a pass. The same with the agent restarted and its memory deleted: the command is bound (in
the engine's state database) to the agent's earlier run, so the new run refuses it, the GPU is reset once, and
the node stays drained (whether the reset finished is not known: the shipped rules ask for a reboot)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.checks.conftest import behave
from tests.checks.conftest import standins as standins  # the stand-in checks fixture
from tests.daemons import Daemon, free_port
from tests.e2e import remediation_loop as loop
from tests.e2e.remediation_loop import REAL_SCONTROL, history_cli, kernel_says, start_agent, start_engine
from tests.harness.slurm import SlurmCluster
from tests.support import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.real]

NODE = "gpu-3"
#: the simulated board's second GPU (bus 0x2a), as the kernel prints it
XID95 = "NVRM: Xid (PCI:0000:2a:00): 95, pid=<unknown>, name=<unknown>, Uncontained ECC error."
GPU = "0000:2a:00.0"
RESET_DELAY_S = 2.0


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    slurm_cluster.reset_nodes([NODE])
    yield slurm_cluster
    # a job watchd requeued waits with no node, so "-w NODE" misses it: every job that asked for NODE goes
    listed = slurm_cluster.run("squeue", "-h", "-o", "%i %N %n", check=False).stdout.splitlines()
    slurm_cluster.cancel(*[line.split()[0] for line in listed if NODE in line.split()[1:]])
    for r in slurm_cluster.run("scontrol", "show", "res", "-o", check=False).stdout.splitlines():
        if r.startswith("ReservationName=") and NODE in r:
            slurm_cluster.run("scontrol", "delete", r.split()[0], check=False)
    slurm_cluster.reset_nodes([NODE])


def _agent(engine: Daemon, tmp_path: Path, load: str = "idle") -> tuple[Daemon, Path]:
    scenario = tmp_path / f"gpus-{load}.yaml"
    scenario.write_text(yaml.safe_dump({"seed": 3, "gpus": {"model": "H100-SXM", "count": 8}, "load": load}))

    def simulated_gpus_and_fake_resets(config: dict[str, Any]) -> None:
        config["sources"]["gpu"] = {"backend": "fake", "scenario": str(scenario), "interval_s": 1.0}
        config["commands"]["poll_s"] = 0.5
        config["commands"]["gpu_reset"].update(
            fake_delay_s=RESET_DELAY_S, fake_log=str(tmp_path / "resets.jsonl")
        )

    return start_agent(engine, tmp_path, NODE, simulated_gpus_and_fake_resets)


def _again(engine: Daemon, tmp_path: Path, env: dict[str, str]) -> Daemon:
    """The engine started again on its config (its port: the agent's engine URL, its state database)."""
    again = Daemon("engine", yaml.safe_load(engine.config_path.read_text()), tmp_path, env)
    again.wait_ready()
    return again


def _resets(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "resets.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _actions(engine: Daemon) -> list[dict[str, Any]]:
    return loop.actions(engine, NODE)


def _steps(engine: Daemon) -> list[tuple[str, str]]:
    return loop.steps(engine, NODE)


def _wait(cond: Any, timeout: float, what: str, engine: Daemon, agent: Daemon, cluster: SlurmCluster) -> None:
    loop.wait(cond, timeout, what, cluster, NODE, engine, agent)


def _back_in_service(cluster: SlurmCluster, engine: Daemon) -> bool:
    return loop.back_in_service(cluster, engine, NODE)


def test_xid_to_gpu_reset_to_validated_return_without_a_person(
    cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    behave(standins, gpu_3="pass")
    job = cluster.submit("sleep 600", nodes=1, extra_args=["-w", NODE])
    cluster.wait_job_running(job)
    engine = start_engine(cluster, standins, tmp_path)
    agent, kernel_log = _agent(engine, tmp_path)
    try:
        started = time.time()
        kernel_says(kernel_log, XID95)
        _wait(
            lambda: _back_in_service(cluster, engine),
            120,
            "validated and back in service",
            engine,
            agent,
            cluster,
        )
        back = time.time()
        steps = _steps(engine)
        assert steps[:3] == [("drain", "drained"), ("requeue", "requeued"), ("gpu_reset", "reset")], steps
        assert ("validate", "resumed") in steps and ("reboot", "rebooting") not in steps, steps
        [reset] = _resets(tmp_path)
        assert reset["gpus"] == [GPU], "the GPU of the Xid, once"
        by_action = {a["action"]: a for a in _actions(engine)}
        done = by_action["gpu_reset"]
        assert done["params"]["gpu"] == GPU and done["result"]["gpus"] == [GPU]
        assert done["result"]["seconds"] >= RESET_DELAY_S and len(done["result"]["after"]) == 8
        assert by_action["validate"]["detail"].startswith("auto: node_gpu_reset"), by_action["validate"]
        history = engine.get_json(f"/api/v1/nodes/{NODE}/history")["incidents"]
        assert history[0]["state"] == "returned" and history[0]["evidence"].startswith("watchd: Xid95 2a:00")
        assert [s["action"] for s in history[0]["steps"]][:3] == ["drain", "requeue", "gpu_reset"]
        out = history_cli(engine, NODE)
        assert f"{NODE}: returned" in out and "gpu_reset" in out and "validate" in out, out
        metrics = engine.get("/metrics")
        assert 'watchd_agent_commands_total{command="gpu_reset",outcome="done"} 1.0' in metrics
        assert 'watchd_agent_commands_run_total{command="gpu_reset",outcome="done"} 1.0' in agent.get(
            "/metrics"
        )
        times = {a["action"]: a["time"] for a in _actions(engine)}
        print(
            json.dumps(
                {
                    "xid_to_back_in_service_s": round(back - started, 1),
                    "xid_to_drain_s": round(times["drain"] - started, 2),
                    "drain_to_reset_reported_s": round(times["gpu_reset"] - times["drain"], 1),
                    "reset_s (the fake's)": done["result"]["seconds"],
                    "reset_to_validated_s": round(times["validate"] - times["gpu_reset"], 1),
                }
            )
        )
    finally:
        agent.stop()
        engine.stop()


def test_a_gpu_held_by_a_process_is_not_reset_and_the_node_is_rebooted_instead(
    cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    """The scheduler says the node runs no job, yet a process holds the GPU (the simulated board's load is a
    training run): the agent refuses, the node stays drained, and the shipped rules ask for a reboot instead
    and tell the on-call (this shared cluster runs ReturnToService=2, where watchd refuses to reboot: the node
    then stays drained, never in service without a pass)."""
    behave(standins, gpu_3="pass")
    engine = start_engine(cluster, standins, tmp_path)
    agent, kernel_log = _agent(engine, tmp_path, load="training")
    try:
        kernel_says(kernel_log, XID95)
        _wait(
            lambda: any(a["action"] == "gpu_reset" for a in _actions(engine)),
            60,
            "the reset",
            engine,
            agent,
            cluster,
        )
        [reset] = [a for a in _actions(engine) if a["action"] == "gpu_reset"]
        assert reset["outcome"] == "not_reset", reset
        assert "the agent refused the reset of 0000:2a:00.0: in use: pid" in reset["detail"], reset
        _wait(
            lambda: (
                {("reboot", "gpu-reset-not-done"), ("alert", "gpu-reset-not-done")}
                <= {(a["action"], a["rule"]) for a in _actions(engine)}
            ),
            30,
            "the reboot asked instead, and the word to the on-call",
            engine,
            agent,
            cluster,
        )
        time.sleep(2)
        [reboot] = [a for a in _actions(engine) if a["action"] == "reboot"]
        assert reboot["outcome"] in ("rebooting", "refused"), reboot
        assert _resets(tmp_path) == [] and "DRAIN" in cluster.node_state(NODE)
        assert not any(a["action"] == "validate" for a in _actions(engine))
        assert not any(a["rule"] == "remediation-limit" for a in _actions(engine))
        out = history_cli(engine, NODE)
        assert "gpu_reset     not_reset" in out and "reboot" in out, out
        print(out)
    finally:
        agent.stop()
        engine.stop()


@pytest.mark.parametrize("step", ["after_the_command_is_queued", "while_the_agent_resets"])
def test_kill9_never_resets_twice_nor_returns_an_unvalidated_node(
    step: str, cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    behave(standins, gpu_3="pass")
    job = cluster.submit("sleep 600", nodes=1, extra_args=["-w", NODE])  # the reset waits for it to end
    cluster.wait_job_running(job)
    engine = start_engine(cluster, standins, tmp_path, {"WATCHD_REAL_SCONTROL": REAL_SCONTROL})
    agent, kernel_log = _agent(engine, tmp_path)
    second: Daemon | None = None
    stopped = False
    try:
        kernel_says(kernel_log, XID95)
        if step == "after_the_command_is_queued":
            # the agent frozen once the Xid reached the engine, before the command exists: it never fetches it
            _wait(lambda: ("drain", "drained") in _steps(engine), 30, "the drain", engine, agent, cluster)
            os.kill(agent.proc.pid, signal.SIGSTOP)
            stopped = True
            wait_for(lambda: "agent_command_queued" in engine.log_path.read_text(), 30, "the command queued")
        else:
            wait_for(
                lambda: "command_running" in agent.log_path.read_text(), 30, "the agent running the reset"
            )
        os.kill(engine.proc.pid, signal.SIGKILL)
        engine.proc.wait()
        engine.stop()
        assert cluster.reason(NODE) is not None, "out of service while the engine is gone"
        second = _again(engine, tmp_path, {"WATCHD_REAL_SCONTROL": REAL_SCONTROL})
        if stopped:
            os.kill(agent.proc.pid, signal.SIGCONT)
            stopped = False
        _wait(
            lambda: _back_in_service(cluster, second),
            120,
            "validated and back in service",
            second,
            agent,
            cluster,
        )
        assert len(_resets(tmp_path)) == 1, "reset exactly once"
        steps = _steps(second)
        assert ("gpu_reset", "reset") in steps and ("validate", "resumed") in steps, steps
        [reset] = [a for a in _actions(second) if a["action"] == "gpu_reset"]
        assert "re-driven after a restart" in reset["detail"], reset
        log = agent.log_path.read_text()
        assert log.count('"command_running"') == 1, "run once; the second ask answered from memory"
        assert "command_reported" in log
    finally:
        if stopped:
            os.kill(agent.proc.pid, signal.SIGCONT)
        agent.stop()
        engine.stop()
        if second is not None:
            second.stop()


def test_kill9_of_the_engine_and_an_agent_restarted_without_its_memory_reset_once(
    cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    behave(standins, gpu_3="pass")
    engine = start_engine(cluster, standins, tmp_path)
    agent, kernel_log = _agent(engine, tmp_path)
    second: Daemon | None = None
    restarted: Daemon | None = None
    try:
        kernel_says(kernel_log, XID95)
        wait_for(lambda: "command_running" in agent.log_path.read_text(), 30, "the agent running the reset")
        os.kill(engine.proc.pid, signal.SIGKILL)  # its result never reaches the engine
        engine.proc.wait()
        engine.stop()
        wait_for(lambda: len(_resets(tmp_path)) == 1, 30, "the reset done")
        os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait()
        agent.stop()
        state = Path(yaml.safe_load(agent.config_path.read_text())["commands"]["state_file"])
        state.unlink()  # the agent's memory of the command is gone
        config = yaml.safe_load(agent.config_path.read_text())
        config["listen"]["port"] = free_port()
        config["heartbeat"]["http_port"] = free_port()
        restarted = Daemon("agent", config, tmp_path)
        restarted.wait_ready()
        second = _again(engine, tmp_path, {})
        _wait(
            lambda: any(a["action"] == "gpu_reset" for a in _actions(second)),
            60,
            "the re-driven reset answered",
            second,
            restarted,
            cluster,
        )
        assert len(_resets(tmp_path)) == 1, "reset exactly once"
        [reset] = [a for a in _actions(second) if a["action"] == "gpu_reset"]
        assert reset["outcome"] == "not_reset", reset
        assert "fetched by an earlier run of this agent" in reset["detail"], reset
        assert "whether it ran is not known" in reset["detail"], reset
        assert "command_running" not in restarted.log_path.read_text()
        assert "DRAIN" in cluster.node_state(NODE), "never in service without a pass"
        assert not any(a["action"] == "validate" for a in _actions(second))
    finally:
        agent.stop()
        engine.stop()
        for daemon in (restarted, second):
            if daemon is not None:
                daemon.stop()


def test_a_node_an_operator_resumes_before_its_agent_asks_is_never_reset(
    cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    """The reset is queued while the node's agent does not ask (a slow poll); an operator resumes the node
    and Slurm starts a user's job there. When the agent asks, the engine withdraws the command: the GPU is
    not reset, the job runs on, and nothing is asked in its place (no reboot)."""
    behave(standins, gpu_3="pass")
    engine = start_engine(cluster, standins, tmp_path)
    scenario = tmp_path / "gpus-idle.yaml"
    scenario.write_text(
        yaml.safe_dump({"seed": 3, "gpus": {"model": "H100-SXM", "count": 8}, "load": "idle"})
    )

    def slow_poll(poll_s: float) -> Any:
        def configure(config: dict[str, Any]) -> None:
            config["sources"]["gpu"] = {"backend": "fake", "scenario": str(scenario), "interval_s": 1.0}
            config["commands"]["poll_s"] = poll_s
            config["commands"]["gpu_reset"].update(fake_delay_s=0.1, fake_log=str(tmp_path / "resets.jsonl"))

        return configure

    agent, kernel_log = start_agent(engine, tmp_path, NODE, slow_poll(3600.0))  # asked once, at its start
    try:
        kernel_says(kernel_log, XID95)

        def queued() -> bool:
            return bool(engine.get_json("/api/v1/status")["agent_commands"]["pending"])

        _wait(queued, 30, "the reset queued", engine, agent, cluster)
        cluster.resume(NODE)  # the operator
        job = cluster.submit("sleep 600", nodes=1, extra_args=["-w", NODE])
        cluster.wait_job_running(job)
        agent.stop()
        agent, _ = start_agent(engine, tmp_path, NODE, slow_poll(0.5))

        def ended() -> bool:
            return any(a["action"] == "gpu_reset" for a in _actions(engine))

        _wait(ended, 30, "the reset ended", engine, agent, cluster)
        [reset] = [a for a in _actions(engine) if a["action"] == "gpu_reset"]
        assert reset["outcome"] == "withdrawn", reset
        assert "no longer out of service by watchd (" in reset["detail"], reset
        assert "MIXED" in reset["detail"] or "ALLOCATED" in reset["detail"], reset  # the user's job there
        time.sleep(2)  # a command handed out anyway would be run by now
        assert _resets(tmp_path) == []
        assert cluster.job(job)["JobState"] == "RUNNING"
        assert not [a for a in _actions(engine) if a["action"] == "reboot"]
        assert 'watchd_agent_commands_total{command="gpu_reset",outcome="withdrawn"} 1.0' in engine.get(
            "/metrics"
        )
    finally:
        agent.stop()
        engine.stop()
