"""A PostgreSQL failover with a GPU reset in flight gives one reset: two real engines (an HA pair on a real
PostgreSQL, the shipped default rules, validation by the stand-in checks) acting on the real Slurm cluster,
and a real agent of one node (simulated GPUs, the fake reset: a delay and a log of every reset) shipping to
one address that reaches the ready engine (:class:`tests.harness.ready_proxy.ReadyProxy`, the load balancer
docs/ha.md asks for: the agent takes one engine URL).

An Xid 95 -> the leader drains the node and asks its agent for a ``gpu_reset``; the agent fetches it (the
command bound, in the shared store, to this run of the agent) and resets. ``kill -9`` of the leader while it
resets (its result never reaches it):

- the follower takes the lead, drives the open ``gpu_reset`` intent again with the same command id, the agent
  answers from memory: one reset, recorded, and validation returns the node to service on a pass;
- the agent also ``kill -9``-ed before it could report and started again with its memory deleted: the new run
  refuses the command (bound to the earlier run), one reset, and the action ends ``not_reset``; the new
  leader feeds that back to the rules as the first would have, so the shipped rule ``gpu-reset-not-done``
  asks for a reboot (not a reset) and tells the on-call. On the shared cluster (``ReturnToService=2``)
  watchd refuses that reboot and the node stays drained; on a cluster of its own (``ReturnToService=1``)
  the node is rebooted once and returned by a validation pass.

Either way the node is never in service without a validation pass: a watcher samples its Slurm state
throughout and every moment in service is after every check of a validation has passed."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.checks.conftest import behave
from tests.checks.conftest import standins as standins  # the stand-in checks fixture
from tests.checks.test_validation_kill9 import engine_config as checks_engine_config
from tests.daemons import Daemon, agent_config, free_port
from tests.e2e import remediation_loop as loop
from tests.e2e.remediation_loop import REAL_SCONTROL, kernel_says
from tests.ha.pair import HaPair
from tests.harness.postgres import PostgresServer
from tests.harness.ready_proxy import ReadyProxy
from tests.harness.slurm import SlurmCluster
from tests.support import wait_for
from watchd.integrations.slurm.checks import parse_reservations

pytestmark = [pytest.mark.slurm, pytest.mark.real]

NODE = "gpu-2"
#: the simulated board's second GPU (bus 0x2a), as the kernel prints it
XID95 = "NVRM: Xid (PCI:0000:2a:00): 95, pid=<unknown>, name=<unknown>, Uncontained ECC error."
GPU = "0000:2a:00.0"
#: the reset ends well inside the lease: its result finds no engine ready (the leader dead, the follower
#: not leading yet), so the only way the follower learns of it is to ask again
RESET_DELAY_S = 2.0
LEASE_S = 6.0
CHECKS = ("nccl", "dcgm")


def _clean(cluster: SlurmCluster) -> None:
    listed = cluster.run("squeue", "-h", "-o", "%i %N %n", check=False).stdout.splitlines()
    cluster.cancel(*[line.split()[0] for line in listed if NODE in line.split()[1:]])
    for r in cluster.run("scontrol", "show", "res", "-o", check=False).stdout.splitlines():
        if r.startswith("ReservationName=") and NODE in r:
            cluster.run("scontrol", "delete", r.split()[0], check=False)
    cluster.reset_nodes([NODE])


@pytest.fixture(scope="module")
def rebooting_cluster() -> Iterator[SlurmCluster]:
    with loop.rebooting_slurm() as cluster:
        yield cluster


@pytest.fixture(params=["reboots_refused", "reboots"])
def cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """The shared cluster (``ReturnToService=2``: watchd refuses to reboot), or one where it may reboot."""
    name = "slurm_cluster" if request.param == "reboots_refused" else "rebooting_cluster"
    chosen: SlurmCluster = request.getfixturevalue(name)
    _clean(chosen)
    yield chosen
    _clean(chosen)


@pytest.fixture
def shared_cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    _clean(slurm_cluster)
    yield slurm_cluster
    _clean(slurm_cluster)


class InService:
    """Samples the node's Slurm state until stopped, from the first time it is out of service: the times it
    was back in service (neither drained, down, rebooting, nor held by a reservation: watchd's validation
    puts the node in one before it lifts the drain)."""

    def __init__(self, cluster: SlurmCluster) -> None:
        self._cluster = cluster
        self.times: list[float] = []
        self.states: list[str] = []
        self._out = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> InService:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _sample(self) -> None:
        while not self._stop.is_set():
            at = time.time()
            shown = self._cluster.run("scontrol", "show", "node", "-o", NODE, check=False).stdout
            state = next((f for f in shown.split() if f.startswith("State=")), "State=?")
            resv = self._cluster.run("scontrol", "show", "res", "-o", check=False).stdout
            held = [r["name"] for r in parse_reservations(resv) if NODE in r["nodes"]]
            seen = state + "".join(f" in {name}" for name in held)
            if not self.states or self.states[-1] != seen:
                self.states.append(seen)
            out = held or any(w in state for w in ("DRAIN", "MAINT", "DOWN", "REBOOT", "RESERVED", "?"))
            self._out = self._out or bool(out)
            if self._out and not out:
                self.times.append(at)
            self._stop.wait(0.3)


def _pair(cluster: SlurmCluster, pg: PostgresServer, standins: Path, tmp_path: Path) -> HaPair:
    """Engines a and b on one database: the shipped default rules, the stand-in checks, the real scontrol."""
    checks = checks_engine_config(cluster, standins, tmp_path, Path(REAL_SCONTROL))
    extra = {"rules": [], "default_rules": True, "checks": checks["checks"], "slurm": checks["slurm"]}
    pair = HaPair(pg, tmp_path, slurm_conf=str(cluster.conf_path), lease_s=LEASE_S, extra=extra)
    (tmp_path / "token").chmod(0o600)
    return pair


def _agent(url_port: int, tmp_path: Path) -> tuple[Daemon, Path]:
    """The node's agent, shipping to ``url_port`` (the proxy): simulated GPUs, the fake reset."""
    scenario = tmp_path / "gpus.yaml"
    gpus = {"seed": 3, "gpus": {"model": "H100-SXM", "count": 8}, "load": "idle"}
    scenario.write_text(yaml.safe_dump(gpus))
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    config = agent_config(NODE, url_port, tmp_path / "token", kernel_log)
    config["sources"]["gpu"] = {"backend": "fake", "scenario": str(scenario), "interval_s": 1.0}
    config["commands"]["poll_s"] = 0.5
    fake_reset = {"fake_delay_s": RESET_DELAY_S, "fake_log": str(tmp_path / "resets.jsonl")}
    config["commands"]["gpu_reset"].update(fake_reset)
    agent = Daemon("agent", config, tmp_path)
    agent.wait_ready()
    return agent, kernel_log


def _again_without_memory(agent: Daemon, tmp_path: Path) -> Daemon:
    """The agent started again on its config, its ``commands.state_file`` deleted (new ports: the old ones
    may linger)."""
    config = yaml.safe_load(agent.config_path.read_text())
    Path(config["commands"]["state_file"]).unlink()
    config["listen"]["port"] = free_port()
    config["heartbeat"]["http_port"] = free_port()
    again = Daemon("agent", config, tmp_path)
    again.wait_ready()
    return again


def _resets(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "resets.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _log_events(daemon: Daemon, event: str) -> list[dict[str, Any]]:
    """The daemon's JSON log lines of ``event``."""
    out = []
    for line in daemon.log_path.read_text(errors="replace").splitlines():
        if f'"{event}"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _passes(pair: HaPair) -> list[float]:
    """When each validation of the node passed: the time its last check passed, once every check did."""
    rows = pair.rows(
        "SELECT check_name, finished_at, outcome FROM check_runs WHERE node = %s AND validation = 1 "
        "AND finished_at IS NOT NULL ORDER BY finished_at",
        (NODE,),
    )
    passed: dict[str, float] = {}
    out = []
    for name, finished, outcome in rows:
        if outcome != "passed":
            passed.clear()
            continue
        passed[str(name)] = float(finished)
        if set(CHECKS) <= set(passed):
            out.append(max(passed.values()))
            passed.clear()
    return out


def _reboots(cluster: SlurmCluster) -> int:
    """The reboots of the node the cluster's RebootProgram played so far."""
    return [e["event"] for e in cluster.reboot_events(NODE)].count("called")


def _kill9(daemon: Daemon) -> None:
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait()


def _never_in_service_without_a_pass(watch: InService, pair: HaPair) -> None:
    passes = _passes(pair)
    early = [t for t in watch.times if not passes or t < passes[0]]
    assert not early, (early[:3], passes, watch.states)


def _stop(*daemons: Daemon | None) -> None:
    for daemon in daemons:
        if daemon is not None:
            daemon.stop()


def _start(
    cluster: SlurmCluster, pg: PostgresServer, standins: Path, tmp_path: Path
) -> tuple[HaPair, Daemon, Daemon]:
    behave(standins, gpu_2="pass")
    pair = _pair(cluster, pg, standins, tmp_path)
    a = pair.start("a")
    assert pair.leader()[0] == "a"
    b = pair.start("b")
    return pair, a, b


def _kill9_the_leader_while_the_agent_resets(a: Daemon, agent: Daemon, kernel_log: Path) -> float:
    """The Xid; once the agent runs the reset, ``kill -9`` of the leader (a). When it was killed."""
    kernel_says(kernel_log, XID95)
    wait_for(lambda: _log_events(agent, "command_running"), 60, "the agent running the reset")
    _kill9(a)
    return time.monotonic()


def test_kill9_of_the_leader_while_the_agent_resets_gives_one_reset_and_a_validated_return(
    shared_cluster: SlurmCluster, pg_server: PostgresServer, standins: Path, tmp_path: Path
) -> None:
    cluster = shared_cluster
    pair, a, b = _start(cluster, pg_server, standins, tmp_path)
    agent: Daemon | None = None
    started = time.monotonic()
    try:
        with ReadyProxy([a.port, b.port]) as proxy, InService(cluster) as watch:
            agent, kernel_log = _agent(proxy.port, tmp_path)
            killed = _kill9_the_leader_while_the_agent_resets(a, agent, kernel_log)
            assert cluster.reason(NODE) is not None, "out of service while no engine leads"
            assert pair.leader()[0] == "b"
            led = time.monotonic()
            loop.wait(
                lambda: loop.back_in_service(cluster, b, NODE),
                90,
                "validated and back in service",
                cluster,
                NODE,
                b,
                agent,
            )
            back = time.monotonic()
        assert proxy.targets == [a.port, b.port], "the agent reached a, then b"
        [reset] = _resets(tmp_path)
        assert reset["gpus"] == [GPU], "the GPU of the Xid, reset once"
        [running] = _log_events(agent, "command_running")
        assert "command_reported" in agent.log_path.read_text(), "answered from memory"
        steps = loop.steps(b, NODE)
        assert steps == [
            ("drain", "drained"),
            ("requeue", "nothing_to_requeue"),
            ("gpu_reset", "reset"),
            ("validate", "resumed"),
        ], steps
        [done] = [x for x in loop.actions(b, NODE) if x["action"] == "gpu_reset"]
        assert done["result"]["command"] == running["command"], "asked again with the same command id"
        assert "re-driven after a restart" in done["detail"], done
        assert done["result"]["gpus"] == [GPU]
        [fetched] = _log_events(b, "agent_command_fetched")
        assert fetched["command"] == running["command"] and fetched["bound_to"] == fetched["instance"]
        assert not _log_events(b, "agent_command_result_refused")
        _never_in_service_without_a_pass(watch, pair)
        print(
            json.dumps(
                {
                    "xid_to_kill_s": round(killed - started, 1),
                    "kill_to_follower_leads_s": round(led - killed, 1),
                    "kill_to_validated_return_s": round(back - killed, 1),
                    "states": watch.states,
                }
            )
        )
    finally:
        _stop(agent)
        pair.stop()


def test_kill9_of_the_leader_and_of_the_agent_without_its_memory_gives_one_reset_and_a_reboot_instead(
    cluster: SlurmCluster, pg_server: PostgresServer, standins: Path, tmp_path: Path
) -> None:
    reboots_before = _reboots(cluster)
    pair, a, b = _start(cluster, pg_server, standins, tmp_path)
    agent: Daemon | None = None
    restarted: Daemon | None = None
    try:
        with ReadyProxy([a.port, b.port]) as proxy, InService(cluster) as watch:
            agent, kernel_log = _agent(proxy.port, tmp_path)
            killed = _kill9_the_leader_while_the_agent_resets(a, agent, kernel_log)
            wait_for(lambda: _resets(tmp_path), 30, "the reset done")
            _kill9(agent)  # before any engine leads again: its result reached none
            assert time.monotonic() - killed < LEASE_S * 2 / 3, "killed within the lease"
            assert "command_reported" not in agent.log_path.read_text(), agent.log()
            agent.stop()
            restarted = _again_without_memory(agent, tmp_path)
            loop.wait(
                lambda: any(x["action"] == "gpu_reset" for x in loop.actions(b, NODE)),
                60,
                "the re-driven reset answered",
                cluster,
                NODE,
                b,
                restarted,
            )
            assert pair.leader()[0] == "b"
            # what the shipped rules do next (a reboot: not a reset), and the word to the on-call
            loop.wait(
                lambda: {"reboot", "alert"} <= {x["action"] for x in loop.actions(b, NODE)},
                30,
                "the reboot asked instead, and the word to the on-call",
                cluster,
                NODE,
                b,
                restarted,
            )
            if cluster.return_to_service != 2:
                loop.wait(
                    lambda: loop.back_in_service(cluster, b, NODE),
                    90,
                    "rebooted, validated and back in service",
                    cluster,
                    NODE,
                    b,
                    restarted,
                )
            time.sleep(3)  # a second reset or an unvalidated return would have happened by now
        assert proxy.targets == [a.port, b.port]
        assert len(_resets(tmp_path)) == 1, "reset exactly once"
        assert not _log_events(restarted, "command_running"), "the new run ran nothing"
        [reset] = [x for x in loop.actions(b, NODE) if x["action"] == "gpu_reset"]
        assert reset["outcome"] == "not_reset", reset
        assert "fetched by an earlier run of this agent" in reset["detail"], reset
        assert "whether it ran is not known" in reset["detail"], reset
        [reboot] = [x for x in loop.actions(b, NODE) if x["action"] == "reboot"]
        assert reboot["rule"] == "gpu-reset-not-done", reboot
        rebooted = _reboots(cluster) - reboots_before
        steps = loop.steps(b, NODE)
        said = {"reboot": [reboot["outcome"], reboot["detail"]], "steps": steps, "states": watch.states}
        print(json.dumps(said))
        if cluster.return_to_service == 2:  # watchd refuses to reboot: the node stays drained, for a person
            assert reboot["outcome"] == "refused", reboot
            assert "ReturnToService=2" in reboot["detail"], reboot
            assert "DRAIN" in cluster.node_state(NODE), "never in service without a pass"
            assert not any(x["action"] == "validate" for x in loop.actions(b, NODE))
            assert rebooted == 0
        else:  # rebooted once (a reboot is not a reset) and returned by a validation pass
            assert reboot["outcome"] == "rebooting", reboot
            assert rebooted == 1, cluster.reboot_events(NODE)
            assert ("validate", "resumed") in steps, steps
            [validate] = [x for x in loop.actions(b, NODE) if x["action"] == "validate"]
            assert validate["detail"].startswith("auto: node_rebooted"), validate
        _never_in_service_without_a_pass(watch, pair)
    finally:
        _stop(agent, restarted)
        pair.stop()
