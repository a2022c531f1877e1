"""deploy/kubernetes: the manifests parse, have the expected kinds and wiring, and the engine's RBAC allows
every API call the adapter, the job provider and leader election make (recorded by the in-process API
server while the adapter tests run the real client)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.kube_api import KubeApiServer
from tests.integrations.test_kubernetes_adapter import _job_pods, kubeconfig
from watchd.integrations.kubernetes.client import make_client
from watchd.integrations.kubernetes.jobs import KubernetesJobProvider
from watchd.integrations.kubernetes.lease import LeaseElector
from watchd.integrations.kubernetes.scheduler import KubernetesScheduler

DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy" / "kubernetes"


def docs() -> list[dict[str, Any]]:
    out = []
    for f in sorted(DEPLOY.glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    return out


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in docs() if d["kind"] == kind]


def test_kinds_and_wiring(tmp_path: Path) -> None:
    kinds = {d["kind"] for d in docs()}
    assert {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
        "DaemonSet",
        "PodMonitor",
    } <= kinds
    (ds,) = by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert {"operator": "Exists"} in pod["tolerations"]
    assert any(v.get("hostPath", {}).get("path") == "/dev/kmsg" for v in pod["volumes"])
    (dep,) = by_kind("Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and dep["spec"]["replicas"] >= 2
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "watchd-engine"
    # the configs in the ConfigMaps are valid watchd configs, and the rules valid rules
    from watchd.config import AgentConfig, EngineConfig, parse_config
    from watchd.rules import load_rules

    maps = {m["metadata"]["name"]: m["data"] for m in by_kind("ConfigMap")}
    engine = parse_config(EngineConfig, yaml.safe_load(maps["watchd-engine-config"]["engine.yaml"]), "engine")
    assert (
        engine.kubernetes.enabled and engine.state.postgres.leader_election.enabled
    )  # issue 22: shared state
    agent = parse_config(AgentConfig, yaml.safe_load(maps["watchd-agent-config"]["agent.yaml"]), "agent")
    # the heartbeat socket lives in the host folder the DaemonSet shares with training pods
    assert agent.heartbeat.socket is not None
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    shared = [v["name"] for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/run/watchd"]
    assert shared and mounts[shared[0]] == str(agent.heartbeat.socket.parent)
    # the site's rules add to the defaults: every default rule stays active
    from watchd.rules import default_rules, effective_rules, parse_rule_file

    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "site.yaml").write_text(maps["watchd-rules"]["site.yaml"])
    assert engine.rules == [Path("/etc/watchd/rules")] and engine.default_rules
    effective = effective_rules([folder], defaults=engine.default_rules)
    assert effective.problems == []
    pack = [r.name for text, src in default_rules() for r in parse_rule_file(text, src)[0]]
    active = [e.name for e in effective.entries if e.state == "active"]
    assert active == [*pack, "site-xid-audit"]
    assert load_rules([folder]).names == active


def allowed(role_kinds: tuple[str, ...]) -> set[tuple[str, str, str]]:
    sa_roles = set()
    for b in by_kind("ClusterRoleBinding") + by_kind("RoleBinding"):
        if any(s["name"] == "watchd-engine" for s in b["subjects"]):
            sa_roles.add(b["roleRef"]["name"])
    out = set()
    for role in [r for k in role_kinds for r in by_kind(k)]:
        if role["metadata"]["name"] in sa_roles:
            for rule in role["rules"]:
                for g in rule["apiGroups"]:
                    for res in rule["resources"]:
                        for v in rule["verbs"]:
                            out.add((g, res, v))
    return out


async def test_rbac_covers_every_call(tmp_path: Path) -> None:
    async with KubeApiServer() as api:
        for i in range(1, 5):
            api.add_node(f"gpu-{i}")
        _job_pods(api)
        api.add_pod("ml", "web-0", "gpu-2", labels={"app": "web"})
        api.add_pdb("ml", "web", {"app": "web"}, min_available=1)
        kc = kubeconfig(api, tmp_path, token="")
        k8s = KubernetesScheduler(
            make_client(kc, in_cluster=False),
            eviction_deadline_s=0.2,
            eviction_backoff_s=(0.05, 0.1),
            delete_after_deadline=True,
        )
        await k8s.pools()
        await k8s.drain({"gpu-1": "Xid 79", "gpu-2": "Xid 79"})
        await k8s.wait_evictions()
        await k8s.requeue_jobs_on("gpu-3")
        k8s.requeue_mode = "annotate"
        await k8s.requeue_jobs_on("gpu-4")
        await k8s.resume("gpu-1")
        await KubernetesJobProvider(k8s.client).running_jobs()
        el = LeaseElector(
            make_client(kc, in_cluster=False), namespace="watchd", name="watchd-engine", identity="x"
        )
        await el.try_acquire_or_renew()
        await el.try_acquire_or_renew()
        await el.client.close()
        await k8s.aclose()
        used = {(c.group, c.resource, c.verb) for c in api.calls}
    rbac = allowed(("ClusterRole", "Role"))
    assert used - rbac == set(), f"calls the RBAC does not allow: {sorted(used - rbac)}"
    assert {("", "pods/eviction", "create"), ("coordination.k8s.io", "leases", "update")} <= used
    assert rbac - used == set(), f"RBAC grants more than the adapter uses: {sorted(rbac - used)}"


@pytest.mark.real
def test_alert_rules_pass_promtool(promtool: str) -> None:
    alerts = DEPLOY / "alerts"
    for args in (["check", "rules", "watchd-alerts.yaml"], ["test", "rules", "watchd-alerts.test.yaml"]):
        r = subprocess.run([promtool, *args], cwd=alerts, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    amtool = shutil.which("amtool")
    assert amtool is not None
    r = subprocess.run(
        [amtool, "check-config", str(alerts / "alertmanager-route.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_grafana_dashboard() -> None:
    dash = json.loads((DEPLOY / "grafana" / "watchd-fleet.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(dash["panels"]) >= 8 and all("watchd_" in e or "up{" in e for e in exprs)
