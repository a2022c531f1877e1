"""The monitoring stack for real: a real `watchd engine` and `watchd agent` started from the CLI on loopback
(the engine enforcing over the in-memory scheduler with checks and reliability on, the agent reading
simulated GPUs that take an uncorrectable ECC error, their processes in a Slurm job), a real Prometheus
(/usr/bin/prometheus) scraping both with the shipped bare-metal scrape config and rule file, and a real
Alertmanager. Asserted: `promtool check metrics` on both daemons' /metrics (process metrics, build info, no
`_created`, no per-GPU counter with a `job` label); every query of the shipped Grafana dashboard returns
data (but the fair-share row, which needs Slurm accounting: tests/reports); the dashboard's variables find
the cluster and both jobs; the shipped alert rules evaluate without error; the joins of docs/gpu-metrics.md
return the job."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemons import Daemon, free_port
from tests.harness.alertmanager import AlertmanagerProcess
from tests.harness.alertmanager import available as am_available
from tests.monitoring.dashboard import ACCOUNTING, expand, queries
from tests.support import real_components_required

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "test-cluster"
JOB = "slurm:4242"
SEED = 1
NODES = ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]


def prometheus_binary() -> str:
    path = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None
    )
    if path is None:
        if real_components_required():
            pytest.fail("prometheus is required here (CI) but not installed: apt-get install prometheus")
        pytest.skip("prometheus is not installed (Debian package prometheus)")
    return path


@dataclass
class Stack:
    engine: Daemon
    agent: Daemon
    prometheus_url: str
    token: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.prometheus_url + path, timeout=10) as r:
            return json.loads(r.read())


def fake_proc(root: Path, gpus: int) -> Path:
    """A /proc where the simulated GPUs' processes (the fake backend's pids) belong to Slurm job 4242."""
    for index in range(gpus):
        pid = 10_000 + (SEED * 7919) % 50_000 + index  # watchd.sim.gpu.FakeGpuBackend._pids
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(
            "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"
        )
    return root


def prometheus_config(engine_port: int, agent_port: int, am_port: int) -> dict[str, Any]:
    """The shipped bare-metal config (deploy/prometheus/prometheus.yaml) pointed at this test's targets, at a
    1 s pace: its job names, relabelling and cluster label kept."""
    config: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yaml").read_text())
    config["global"].update(
        scrape_interval="1s", evaluation_interval="1s", external_labels={"cluster": CLUSTER}
    )
    config["rule_files"] = [str(ROOT / "deploy" / "prometheus" / "watchd-alerts.yaml")]
    config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{am_port}"]}]
    targets = {"watchd-engine": engine_port, "watchd-agent": agent_port}
    for scrape in config["scrape_configs"]:
        scrape["static_configs"] = [
            {"targets": [f"localhost:{targets[scrape['job_name']]}"], "labels": {"cluster": CLUSTER}}
        ]
    return config


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    prometheus = prometheus_binary()
    ok, why = am_available()
    if not ok:
        pytest.skip(why)
    work = Path(tempfile.mkdtemp(prefix="watchd-stack-"))
    token_file = work / "token"
    token_file.write_text("stack-token\n")
    token_file.chmod(0o600)
    scenario = work / "gpus.yaml"
    scenario.write_text(
        f"seed: {SEED}\ngpus: {{model: H100-SXM, count: 2}}\nload: training\n"
        "faults:\n  - {kind: ecc_dbe, at: 12, gpu: 1, remap: pending}\n"  # after Prometheus is up
    )
    engine_port, agent_port = free_port(), free_port()
    started: list[Any] = []
    am = AlertmanagerProcess()
    am.start()
    started.append(am)
    try:
        engine = Daemon(
            "engine",
            {
                "listen": {"host": "127.0.0.1", "port": engine_port},
                "auth": {"token_file": str(token_file)},
                "mode": "enforce",
                "slurm": {"enabled": False},
                "fake": {"enabled": True, "nodes": NODES, "partitions": {"gpu": NODES}},
                "state": {"path": str(work / "state.db")},
                "drains": {"poll_s": 1},
                "spares": {"partitions": {"gpu": 1}},
                "checks": {
                    "enabled": True,
                    "runner": "fake",
                    "output_dir": str(work / "checks"),
                    "items": [{"name": "burn", "type": "command", "command": ["true"]}],
                },
                "reliability": {"interval_s": 1, "flush_s": 1},
                "alertmanager": {"urls": [am.url], "external_labels": {"cluster": CLUSTER}},
                "log": {"format": "json"},
            },
            work,
        )
        started.append(engine)
        engine.wait_ready()
        agent = Daemon(
            "agent",
            {
                "node": "gpu-1",
                "engine": {"url": f"http://127.0.0.1:{engine_port}", "auth": {"token_file": str(token_file)}},
                "listen": {"host": "127.0.0.1", "port": agent_port},
                "sources": {
                    "kmsg": {"enabled": False},
                    "gpu": {
                        "backend": "fake",
                        "scenario": str(scenario),
                        "interval_s": 1,
                        "summary_window_s": 2,
                        "proc_root": str(fake_proc(work / "proc", 2)),
                    },
                },
                "heartbeat": {"enabled": False},
                "shipper": {"backoff_initial_s": 0.05, "backoff_max_s": 1},
                "log": {"format": "json"},
            },
            work,
        )
        started.append(agent)
        agent.wait_ready()
        prom_port = free_port()
        (work / "prometheus.yaml").write_text(
            yaml.safe_dump(prometheus_config(engine_port, agent_port, am.port))
        )
        prom_log = open(work / "prometheus.log", "wb")  # noqa: SIM115 - closed below
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={work / 'prometheus.yaml'}",
                f"--storage.tsdb.path={work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            stdout=prom_log,
            stderr=subprocess.STDOUT,
        )
        stack = Stack(engine, agent, f"http://127.0.0.1:{prom_port}", "stack-token")
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(stack.prometheus_url + "/-/ready", timeout=1):
                    break
            except OSError:
                if prom.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((work / "prometheus.log").read_text()[-3000:]) from None
                time.sleep(0.2)
        # a check run on a node, so the checks row has data
        request = urllib.request.Request(
            f"http://127.0.0.1:{engine_port}/api/v1/checks/run",
            data=json.dumps({"nodes": ["gpu-2"], "checks": ["burn"]}).encode(),
            headers={"Authorization": "Bearer stack-token", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status == 200, r.read()
        yield stack
    finally:
        if "prom" in locals():
            prom.send_signal(signal.SIGTERM)
            try:
                prom.wait(10)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
            prom_log.close()
        for thing in reversed(started):
            thing.stop()
        shutil.rmtree(work, ignore_errors=True)


def metrics_text(daemon: Daemon) -> str:
    with urllib.request.urlopen(f"{daemon.url}/metrics", timeout=5) as r:
        return str(r.read().decode())


def test_both_daemons_pass_promtool_with_process_metrics_and_build_info(stack: Stack, promtool: str) -> None:
    deadline = time.monotonic() + 30
    while "watchd_gpu_job_info{" not in metrics_text(stack.agent) and time.monotonic() < deadline:
        time.sleep(0.5)
    for daemon, name in ((stack.engine, "engine"), (stack.agent, "agent")):
        text = metrics_text(daemon)
        res = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
        )
        assert res.returncode == 0, f"{name}: promtool check metrics:\n{res.stdout}{res.stderr}"
        for series in (
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_start_time_seconds ",
        ):
            assert f"\n{series}" in text, (name, series)
        assert f'watchd_build_info{{daemon="{name}",python_version=' in text, name
        assert "_created" not in text, name
    agent = metrics_text(stack.agent)
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(agent)}
    gpu_counters = [f for n, f in families.items() if n.startswith("watchd_gpu_") and f.type == "counter"]
    assert len(gpu_counters) >= 5
    for family in gpu_counters:
        assert family.samples, family.name
        assert all("job" not in s.labels for s in family.samples), family.name
    assert {s.labels["job_id"] for s in families["watchd_gpu_job_info"].samples} == {JOB}


def test_every_dashboard_query_returns_data_from_a_real_prometheus(stack: Stack) -> None:
    """Data: at least one series with a number (a histogram quantile over a window without observations is
    NaN: not data). ``$__rate_interval`` is 5m: the whole life of the stack, as a graph's range would show."""
    values = {"cluster": CLUSTER, "job": "(watchd-engine|watchd-agent)"}
    live = [q for q in queries() if ACCOUNTING not in q.expr]
    assert len(live) >= 45

    def has_data(expr: str) -> bool:
        return any(r["value"][1] != "NaN" for r in stack.query(expand(expr, values, "5m")))

    empty: list[str] = []
    deadline = time.monotonic() + 120
    while True:
        empty = [f"{q.panel} [{q.ref}]: {q.expr}" for q in live if not has_data(q.expr)]
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert empty == [], "dashboard queries without data:\n" + "\n".join(empty)
    # and what the rows show is what happened: a drain by watchd, an ECC error, a check that passed
    assert stack.query(f'watchd_unavailable_nodes{{owner="watchd", cluster="{CLUSTER}"}}')
    ecc = stack.query("sum(increase(watchd_gpu_ecc_volatile_uncorrected_errors_total[5m]))")
    assert float(ecc[0]["value"][1]) > 0
    assert stack.query('watchd_check_runs_total{check="burn", outcome="passed"} > 0')


def test_the_variables_find_the_cluster_and_both_jobs(stack: Stack) -> None:
    series = stack.get("/api/v1/series?" + urllib.parse.urlencode({"match[]": "watchd_build_info"}))["data"]
    assert {s["cluster"] for s in series} == {CLUSTER}
    assert {s["job"] for s in series} == {"watchd-engine", "watchd-agent"}
    assert {s["daemon"] for s in series} == {"engine", "agent"}
    assert {s.get("node") for s in series if s["daemon"] == "agent"} == {"localhost"}  # the relabelling


def test_the_documented_joins_name_the_job(stack: Stack) -> None:
    util = stack.query(
        "avg by (job_id) (watchd_gpu_utilization_percent * on (uuid) group_left (job_id) watchd_gpu_job_info)"
    )
    assert [r["metric"]["job_id"] for r in util] == [JOB]
    energy = stack.query(
        "sum by (job_id) (increase(watchd_gpu_energy_joules_total[30s]) "
        "* on (uuid) group_left (job_id) watchd_gpu_job_info)"
    )
    assert [r["metric"]["job_id"] for r in energy] == [JOB] and float(energy[0]["value"][1]) > 0
    # the counters themselves carry no job: one series per GPU, whatever ran on it
    assert all(
        "job_id" not in r["metric"] and "exported_job" not in r["metric"]
        for r in stack.query("watchd_gpu_energy_joules_total")
    )


def documented_queries() -> list[str]:
    """The PromQL of docs/gpu-metrics.md's ```promql blocks: one query per paragraph, comments dropped."""
    text = (ROOT / "docs" / "gpu-metrics.md").read_text()
    out = []
    for block in re.findall(r"```promql\n(.*?)```", text, re.S):
        for para in re.split(r"\n\s*\n|\n(?=#)", block):
            expr = " ".join(line for line in para.splitlines() if not line.startswith("#")).strip()
            if expr:
                out.append(expr)
    return out


def test_every_documented_query_returns_data(stack: Stack) -> None:
    exprs = documented_queries()
    assert len(exprs) >= 5
    deadline = time.monotonic() + 60
    while True:
        empty = [e for e in exprs if not stack.query(e.replace("[1h]", "[5m]"))]
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert empty == []
    every_gpu = next(e for e in exprs if " or on (uuid) " in e)
    assert len(stack.query(every_gpu)) == 2


def test_the_shipped_alert_rules_evaluate_without_error(stack: Stack) -> None:
    deadline = time.monotonic() + 30
    while True:
        groups = stack.get("/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(
            r.get("lastEvaluation", "").startswith("2") and r["health"] != "unknown" for r in rules
        ):
            break
        assert time.monotonic() < deadline, rules
        time.sleep(1)
    assert len(rules) == 19
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert bad == []
    # a healthy stack pages nobody about watchd itself
    firing = [r["name"] for r in rules if r["state"] == "firing"]
    assert firing == [], firing
