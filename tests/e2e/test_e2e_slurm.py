"""The whole path on a real Slurm cluster: an Xid line on a node, real `watchd agent` and `watchd engine`
processes, and the node drained with watchd's reason, its job requeued, an admin's drain left alone."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import Daemon, agent_config, engine_config, free_port, watchd_command
from tests.harness.slurm import SlurmCluster
from tests.support import scheduler_actions, wait_for

pytestmark = pytest.mark.slurm

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."
REASON = "watchd: Xid79 3b:00 GPU has fallen off the bus (GPU 0000:3b:00.0)"


def syslog_line(text: str) -> str:
    return f"Dec  2 10:00:01 node kernel: [ 1234.567890] {text}\n"


class Scene:
    def __init__(self, cluster: SlurmCluster, tmp: Path, mode: str) -> None:
        self.cluster = cluster
        self.tmp = tmp
        token = tmp / "token"
        token.write_text("integration-token\n")
        self.engine = Daemon("engine", engine_config(free_port(), token, mode, str(cluster.conf_path)), tmp)
        self.logs = {n: tmp / f"{n}.log" for n in ("gpu-1", "gpu-2", "gpu-3", "gpu-4")}
        self.agents: dict[str, Daemon] = {}
        for node, log in self.logs.items():
            log.write_text("")
            self.agents[node] = Daemon("agent", agent_config(node, self.engine.port, token, log), tmp)
        self.engine.wait_ready()
        for agent in self.agents.values():
            agent.wait_ready()

    def inject(self, node: str, text: str) -> None:
        with open(self.logs[node], "a") as f:
            f.write(syslog_line(text))

    def actions(self) -> list[dict[str, str]]:
        """The drains and requeues in the audit (the rule pack adds alerts and logs around them)."""
        return scheduler_actions(self.engine.get_json("/api/v1/actions")["actions"])

    def stop(self) -> None:
        for agent in self.agents.values():
            assert agent.stop() == 0, agent.log()
        assert self.engine.stop() == 0, self.engine.log()


@pytest.fixture
def clean(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    slurm_cluster.reset_nodes(slurm_cluster.real_node_names)
    yield slurm_cluster
    res = slurm_cluster.run("squeue", "-h", "-o", "%i", check=False)
    slurm_cluster.cancel(*res.stdout.split())
    slurm_cluster.reset_nodes(slurm_cluster.real_node_names)


def start_job(cluster: SlurmCluster) -> tuple[str, list[str]]:
    cluster.drain("gpu-4", "maintenance: replacing fan")
    job = cluster.submit("sleep 600", nodes=2, requeue=True, extra_args=["-w", "gpu-[1-2]"])
    info = cluster.wait_job_running(job)
    assert info["NodeList"] == "gpu-[1-2]"
    return job, ["gpu-1", "gpu-2"]


@pytest.mark.real
def test_xid79_drains_the_node_and_requeues_its_job(clean: SlurmCluster, tmp_path: Path) -> None:
    cluster = clean
    job, _ = start_job(cluster)
    scene = Scene(cluster, tmp_path, "enforce")
    try:
        scene.inject("gpu-2", "NVRM: GPU at PCI:0000:3b:00: GPU-4b6f3a2e-9c1d-4e2f-8a7b-1c2d3e4f5a6b")
        scene.inject("gpu-2", XID79)
        scene.inject("gpu-4", XID79)  # the admin's node: must stay exactly as it was

        wait_for(lambda: "DRAIN" in cluster.node_state("gpu-2"), what="gpu-2 drained")
        assert cluster.reason("gpu-2") == REASON
        wait_for(lambda: int(cluster.job(job).get("Restarts", "0")) >= 1, what="job requeued")
        assert cluster.job(job)["Restarts"] == "1"
        wait_for(lambda: len(scene.actions()) >= 4, what="4 audit records")
        actions = scene.actions()
        by = {(a["node"], a["action"]): a["outcome"] for a in actions}
        assert by == {
            ("gpu-2", "drain"): "drained",
            ("gpu-2", "requeue"): "requeued",
            ("gpu-4", "drain"): "skipped",
            ("gpu-4", "requeue"): "skipped",
        }
        assert cluster.reason("gpu-4") == "maintenance: replacing fan"
        assert "DRAIN" not in cluster.node_state("gpu-1")
        assert "DRAIN" not in cluster.node_state("gpu-3")
        metrics = scene.engine.get("/metrics")
        assert 'watchd_actions_total{action="drain",mode="enforce",outcome="drained"} 1.0' in metrics
        assert 'watchd_actions_total{action="requeue",mode="enforce",outcome="requeued"} 1.0' in metrics
        assert 'watchd_rule_matches_total{rule="xid-fatal-hardware"} 2.0' in metrics

        # An operator returns the node to service through the engine; watchd refuses to resume the admin's
        # drain. Both are in the engine's audit, with who asked.
        resume = [*watchd_command(), "node", "resume", "--config", str(scene.engine.config_path)]
        admin = subprocess.run(
            [*resume, "gpu-4", "--by", "alice"], capture_output=True, text=True, check=False
        )
        assert admin.returncode == 4 and "refused" in admin.stdout  # the engine refuses: 4
        assert cluster.reason("gpu-4") == "maintenance: replacing fan"
        ours = subprocess.run(
            [*resume, "gpu-2", "--by", "alice"], capture_output=True, text=True, check=False
        )
        assert ours.returncode == 0 and "resumed" in ours.stdout, ours.stdout + ours.stderr
        assert "DRAIN" not in cluster.node_state("gpu-2")
        audited = [
            (a["node"], a["rule"], a["outcome"], a["detail"].startswith("by alice"))
            for a in scene.engine.get_json("/api/v1/actions")["actions"]
            if a["action"] == "resume"
        ]
        assert audited == [("gpu-4", "operator", "refused", True), ("gpu-2", "operator", "resumed", True)]
    finally:
        scene.stop()


def test_dry_run_changes_nothing_in_slurm(clean: SlurmCluster, tmp_path: Path) -> None:
    cluster = clean
    job, _ = start_job(cluster)
    before = {n: (cluster.node_state(n), cluster.reason(n)) for n in cluster.real_node_names}
    scene = Scene(cluster, tmp_path, "dry-run")
    try:
        scene.inject("gpu-2", XID79)
        wait_for(lambda: len(scene.actions()) >= 2, what="dry-run decisions")
        actions = scene.actions()
        assert [(a["action"], a["outcome"]) for a in actions] == [
            ("drain", "dry_run"),
            ("requeue", "dry_run"),
        ]
        assert REASON in actions[0]["detail"]
        time.sleep(0.5)
        after = {n: (cluster.node_state(n), cluster.reason(n)) for n in cluster.real_node_names}
        assert after == before
        assert cluster.job(job).get("Restarts") == "0"
        assert cluster.job(job)["JobState"] == "RUNNING"
    finally:
        scene.stop()
