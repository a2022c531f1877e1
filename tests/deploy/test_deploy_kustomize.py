"""deploy/kubernetes as `kubectl apply -k` sends it: the base and the example overlay rendered by the real
``kubectl kustomize`` (no cluster), every object validated against the Kubernetes OpenAPI schemas (the
strict JSON schemas of the ``kubernetes-validate`` package), then what the objects are for: the apply
order, the wiring between them, Pod Security levels, NetworkPolicies, the engine's disruption budget and
the image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import watchd
from tests.deploy.kube_manifests import (
    BASE,
    EXAMPLE,
    Obj,
    Peer,
    admitted,
    baseline_violations,
    connection_allowed,
    find,
    one,
    pod_templates,
    render,
)
from tests.support import real_components_required
from watchd.config import AgentConfig, EngineConfig, parse_config

IMAGE = f"ghcr.io/watchd/watchd:{watchd.__version__}"
#: the oldest Kubernetes the manifests are for (PodDisruptionBudget.spec.unhealthyPodEvictionPolicy is on by
#: default from 1.27), and the newest whose schemas the validator ships
SCHEMA_VERSIONS = ("1.27.0", "1.33.0")
#: kinds whose schema is a CustomResourceDefinition's, not Kubernetes': checked by their wiring below
CUSTOM = {"PodMonitor"}


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return render(BASE)


@pytest.fixture(scope="module")
def example() -> list[Obj]:
    return render(EXAMPLE)


def _validator() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        if real_components_required():
            pytest.fail("kubernetes-validate (a dev dependency) is required to validate deploy/kubernetes")
        pytest.skip("kubernetes-validate is not installed (pip install -e '.[dev]')")
    return kubernetes_validate


@pytest.mark.parametrize("folder", [BASE, EXAMPLE], ids=["base", "overlay"])
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_object_is_valid_against_the_kubernetes_schemas(folder: Path, version: str) -> None:
    kv = _validator()
    objs = render(folder)
    checked = 0
    for o in objs:
        if o["kind"] in CUSTOM:
            continue
        what = f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
        try:
            kv.validate(o, version, strict=True)  # strict: a field the schema does not know is an error
        except kv.ValidationError as exc:
            pytest.fail(f"{folder.name}: {what} is invalid for Kubernetes {version}: {exc.message}")
        checked += 1
    assert checked >= 20


def test_the_validator_catches_what_it_should(base: list[Obj]) -> None:
    """The schema check is not vacuous: a misspelt field, a wrong type and a missing required field fail."""
    kv = _validator()
    dep = one(base, "Deployment", "watchd-engine", "watchd")
    for broken in (
        {**dep, "spec": {**dep["spec"], "replica": 2}},
        {**dep, "spec": {**dep["spec"], "replicas": "two"}},
        {**dep, "spec": {k: v for k, v in dep["spec"].items() if k != "selector"}},
    ):
        with pytest.raises(kv.ValidationError):
            kv.validate(broken, SCHEMA_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("folder", [BASE, EXAMPLE], ids=["base", "overlay"])
def test_apply_order_namespaces_first(folder: Path) -> None:
    """kubectl applies in the rendered order: every namespace before anything in it, service accounts and
    RBAC before the workloads that use them, and no object in a namespace the kustomization lacks."""
    objs = render(folder)
    kinds = [o["kind"] for o in objs]
    namespaces = {o["metadata"]["name"] for o in find(objs, "Namespace")}
    assert namespaces == {"watchd", "watchd-agent", "watchd-checks"}
    last_ns = max(i for i, k in enumerate(kinds) if k == "Namespace")
    for i, o in enumerate(objs):
        ns = o["metadata"].get("namespace")
        if ns is not None:
            assert ns in namespaces, f"{o['kind']} {o['metadata']['name']} in unknown namespace {ns}"
            assert i > last_ns
    first_workload = min(i for i, k in enumerate(kinds) if k in ("Deployment", "DaemonSet"))
    for kind in ("ServiceAccount", "ClusterRole", "Role", "RoleBinding", "ClusterRoleBinding", "ConfigMap"):
        assert max(i for i, k in enumerate(kinds) if k == kind) < first_workload, kind


def test_wiring(base: list[Obj], tmp_path: Path) -> None:
    ds = one(base, "DaemonSet", "watchd-agent", "watchd-agent")
    pod = ds["spec"]["template"]["spec"]
    agent_c = pod["containers"][0]
    env = {e["name"]: e for e in agent_c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert {"operator": "Exists"} in pod["tolerations"]
    assert any(v.get("hostPath", {}).get("path") == "/dev/kmsg" for v in pod["volumes"])
    assert pod["serviceAccountName"] == "watchd-agent"
    one(base, "ServiceAccount", "watchd-agent", "watchd-agent")
    dep = one(base, "Deployment", "watchd-engine", "watchd")
    spec = dep["spec"]["template"]["spec"]
    engine_c = spec["containers"][0]
    assert engine_c["readinessProbe"]["httpGet"]["path"] == "/readyz" and dep["spec"]["replicas"] >= 2
    assert spec["serviceAccountName"] == "watchd-engine"
    one(base, "ServiceAccount", "watchd-engine", "watchd")
    # every ConfigMap a pod mounts is in the pod's namespace
    for workload, template in pod_templates(base):
        ns = workload["metadata"]["namespace"]
        for v in template["spec"].get("volumes", []):
            if "configMap" in v:
                one(base, "ConfigMap", v["configMap"]["name"], ns)
    # the configs are valid watchd configs, and agree with the objects around them
    engine_cm = one(base, "ConfigMap", "watchd-engine-config", "watchd")["data"]["engine.yaml"]
    engine = parse_config(EngineConfig, yaml.safe_load(engine_cm), "engine")
    assert engine.kubernetes.enabled and engine.state.postgres.leader_election.enabled
    assert engine.checks.runner == "kubernetes"
    assert engine.checks.kubernetes.namespace in {n["metadata"]["name"] for n in find(base, "Namespace")}
    agent_cm = one(base, "ConfigMap", "watchd-agent-config", "watchd-agent")["data"]["agent.yaml"]
    agent = parse_config(AgentConfig, yaml.safe_load(agent_cm), "agent")
    svc = one(base, "Service", "watchd-engine", "watchd")
    port = svc["spec"]["ports"][0]
    assert agent.engine.url == f"http://watchd-engine.watchd.svc:{port['port']}"
    ports = {p["name"]: p["containerPort"] for p in engine_c["ports"]}
    assert ports[port["targetPort"]] == engine.listen.port
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert {p["containerPort"] for p in agent_c["ports"]} == {agent.listen.port}
    # the heartbeat socket lives in the host folder the DaemonSet shares with training pods
    assert agent.heartbeat.socket is not None
    mounts = {m["name"]: m["mountPath"] for m in agent_c["volumeMounts"]}
    shared = [v["name"] for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/run/watchd"]
    assert shared and mounts[shared[0]] == str(agent.heartbeat.socket.parent)
    # the token both sides read comes from a Secret of that name in each namespace
    for c, ns in ((agent_c, "watchd-agent"), (engine_c, "watchd")):
        token = {e["name"]: e for e in c["env"]}["WATCHD_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert token == {"name": "watchd-token", "key": "token"}, ns


def _rules_are_valid(objs: list[Obj], tmp_path: Path, expected_site: list[str]) -> None:
    from watchd.rules import default_rules, effective_rules, load_rules, parse_rule_file

    engine_cm = one(objs, "ConfigMap", "watchd-engine-config", "watchd")["data"]["engine.yaml"]
    engine = parse_config(EngineConfig, yaml.safe_load(engine_cm), "engine")
    folder = tmp_path / "rules"
    folder.mkdir()
    for name, text in one(objs, "ConfigMap", "watchd-rules", "watchd")["data"].items():
        (folder / name).write_text(text)
    dep = one(objs, "Deployment", "watchd-engine", "watchd")
    mounts = {
        m["name"]: m["mountPath"] for m in dep["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    rules_volume = next(
        v["name"]
        for v in dep["spec"]["template"]["spec"]["volumes"]
        if v.get("configMap", {}).get("name") == "watchd-rules"
    )
    assert engine.rules == [Path(mounts[rules_volume])] and engine.default_rules
    effective = effective_rules([folder], defaults=engine.default_rules)
    assert effective.problems == []
    pack = [r.name for text, src in default_rules() for r in parse_rule_file(text, src)[0]]
    active = [e.name for e in effective.entries if e.state == "active"]
    assert active == [*pack, *expected_site]  # the site's rules add to the defaults
    assert load_rules([folder]).names == active


def test_base_rules(base: list[Obj], tmp_path: Path) -> None:
    _rules_are_valid(base, tmp_path, ["site-xid-audit"])


def test_overlay_sets_rules_image_runtime_class_and_monitoring(example: list[Obj], tmp_path: Path) -> None:
    _rules_are_valid(example, tmp_path, ["site-xid-audit", "site-thermal-alert"])
    # the rules keep their name (no hash suffix), so the engines hot-reload them rather than restart
    assert find(example, "ConfigMap", "watchd-rules", "watchd")
    images = {c["image"] for _, t in pod_templates(example) for c in t["spec"]["containers"]}
    assert images == {f"registry.example.com/gpu-ops/watchd:{watchd.__version__}"}
    ds = one(example, "DaemonSet", "watchd-agent", "watchd-agent")
    assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert (
        "runtimeClassName" not in one(render(BASE), "DaemonSet", "watchd-agent")["spec"]["template"]["spec"]
    )
    # the PodMonitors select the pods and ports they scrape
    for mon in find(example, "PodMonitor"):
        ns = mon["metadata"]["namespace"]
        (workload,) = [
            w
            for w, t in pod_templates(example)
            if w["metadata"]["namespace"] == ns
            and mon["spec"]["selector"]["matchLabels"].items() <= t["metadata"]["labels"].items()
        ]
        ports = {p["name"] for c in workload["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert {e["port"] for e in mon["spec"]["podMetricsEndpoints"]} <= ports
    assert {m["metadata"]["namespace"] for m in find(example, "PodMonitor")} == {"watchd", "watchd-agent"}
    # the engine's egress narrowed to the API server's address, and Alertmanager added
    egress = one(example, "NetworkPolicy", "watchd-engine-egress", "watchd")["spec"]["egress"]
    assert egress[1]["to"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}]
    assert any(r["ports"] == [{"protocol": "TCP", "port": 9093}] for r in egress)


def test_base_names_the_image_this_tree_builds(base: list[Obj]) -> None:
    images = {c["image"] for _, t in pod_templates(base) for c in t["spec"]["containers"]}
    assert images == {IMAGE}
    assert find(base, "PodMonitor") == []  # only with the Prometheus Operator component


# --------------------------------------------------------------------------------------- Pod Security
def _level(objs: list[Obj], namespace: str) -> str:
    labels = one(objs, "Namespace", namespace)["metadata"].get("labels", {})
    return str(labels.get("pod-security.kubernetes.io/enforce", "privileged"))


def test_pod_security_levels(base: list[Obj]) -> None:
    assert _level(base, "watchd") == "restricted"
    assert _level(base, "watchd-checks") == "baseline"
    assert _level(base, "watchd-agent") == "privileged"
    for workload, template in pod_templates(base):
        ns = workload["metadata"]["namespace"]
        refused = admitted(_level(base, ns), template["spec"])
        assert refused == [], f"{workload['kind']} {workload['metadata']['name']} refused in {ns}: {refused}"
    # the engine: non-root, RuntimeDefault seccomp, read-only root file system, no capability
    engine = one(base, "Deployment", "watchd-engine")["spec"]["template"]["spec"]
    assert engine["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert engine["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    # the agent needs `privileged` and nothing less would admit it: exactly these host accesses
    agent = one(base, "DaemonSet", "watchd-agent")["spec"]["template"]["spec"]
    assert baseline_violations(agent) == [
        "hostPID",
        "hostPath volume kmsg",
        "hostPath volume state",
        "hostPath volume heartbeat",
        "agent: adds ['SYSLOG']",
    ]
    c = agent["containers"][0]["securityContext"]
    assert c["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]} and not c.get("privileged")
    assert c["readOnlyRootFilesystem"] is True and c["allowPrivilegeEscalation"] is False


def test_check_jobs_are_admitted_in_their_namespace(base: list[Obj]) -> None:
    """The Jobs the engine creates for active checks pass the Pod Security level of the namespace its config
    names (and would not pass the engine's); pair checks on the nodes' network need `privileged`."""
    from unittest.mock import MagicMock

    from watchd.checks.runner import CheckJob
    from watchd.integrations.kubernetes.checks import KubernetesCheckRunner

    engine_cm = one(base, "ConfigMap", "watchd-engine-config", "watchd")["data"]["engine.yaml"]
    engine = parse_config(EngineConfig, yaml.safe_load(engine_cm), "engine")
    ns = engine.checks.kubernetes.namespace
    level = _level(base, ns)
    single = CheckJob("nccl", "gpu-1", ("all_reduce_perf", "-g", "8"), 600, "run.1")
    pair = CheckJob("nccl-pair", "gpu-1", ("launch",), 600, "run.2", peers=("gpu-2",))
    for host_network in (False, True):
        runner = KubernetesCheckRunner(MagicMock(), namespace=ns, host_network=host_network)
        for job in (single, pair):
            for rank in range(len(job.nodes)):
                manifest = runner._manifest(job, f"watchd-check-{rank}", rank)
                assert manifest["metadata"]["namespace"] == ns
                spec = manifest["spec"]["template"]["spec"]
                assert admitted("restricted", spec) != []
                if host_network and job.peers:
                    assert admitted(level, spec) == ["hostNetwork"]
                    assert admitted("privileged", spec) == []
                else:
                    assert admitted(level, spec) == [], (job.check, host_network)


# ------------------------------------------------------------------------------------- NetworkPolicy
def _pod(objs: list[Obj], kind: str, name: str) -> Peer:
    w = one(objs, kind, name)
    return Peer.of(w["metadata"]["namespace"], w["spec"]["template"]["metadata"]["labels"])


PROMETHEUS = Peer.of("monitoring", {"app.kubernetes.io/name": "prometheus"})
ALERTMANAGER = Peer.of("monitoring", {"app.kubernetes.io/name": "alertmanager"})
OTHER = Peer.of("ml", {"app": "train"})
KUBE_DNS = Peer.of("kube-system", {"k8s-app": "kube-dns"})


def test_network_policies(base: list[Obj]) -> None:
    engine = _pod(base, "Deployment", "watchd-engine")
    agent = _pod(base, "DaemonSet", "watchd-agent")
    check = Peer.of("watchd-checks", {"app.kubernetes.io/managed-by": "watchd", "watchd.io/check": "nccl"})

    def ok(src: Peer | None, dst: Peer | None, port: int, protocol: str = "TCP") -> bool:
        return connection_allowed(base, src, dst, port, protocol)

    # allowed: agents -> engine ingest; Prometheus -> both metrics ports; engine -> API server, PostgreSQL
    assert ok(agent, engine, 9120)
    assert ok(PROMETHEUS, engine, 9120) and ok(PROMETHEUS, agent, 9121)
    assert ok(engine, None, 443) and ok(engine, None, 6443) and ok(engine, None, 5432)
    for pod in (engine, agent):
        assert ok(pod, KUBE_DNS, 53, "UDP") and ok(pod, KUBE_DNS, 53, "TCP")
    # denied: everyone else in, and anything else out
    assert not ok(OTHER, engine, 9120) and not ok(OTHER, agent, 9121)
    assert not ok(agent, engine, 5432) and not ok(agent, None, 443) and not ok(agent, OTHER, 80)
    assert not ok(engine, agent, 9121) and not ok(engine, None, 80) and not ok(engine, ALERTMANAGER, 9093)
    assert not ok(PROMETHEUS, engine, 9121) and not ok(PROMETHEUS, check, 9400)
    assert not ok(check, None, 443) and not ok(check, engine, 9120) and not ok(check, KUBE_DNS, 53, "UDP")
    assert not ok(OTHER, check, 22)
    # every namespace of watchd denies by default, both ways
    for ns in ("watchd", "watchd-agent", "watchd-checks"):
        deny = one(base, "NetworkPolicy", "default-deny", ns)["spec"]
        assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    # the ports in the policies are the ports the pods listen on
    engine_cfg = parse_config(
        EngineConfig,
        yaml.safe_load(one(base, "ConfigMap", "watchd-engine-config")["data"]["engine.yaml"]),
        "engine",
    )
    agent_cfg = parse_config(
        AgentConfig,
        yaml.safe_load(one(base, "ConfigMap", "watchd-agent-config")["data"]["agent.yaml"]),
        "agent",
    )
    assert ok(agent, engine, engine_cfg.listen.port) and ok(PROMETHEUS, agent, agent_cfg.listen.port)


def test_overlay_network_policies(example: list[Obj]) -> None:
    engine = _pod(example, "Deployment", "watchd-engine")
    assert connection_allowed(example, engine, ALERTMANAGER, 9093)
    assert not connection_allowed(example, engine, OTHER, 9093)


# ------------------------------------------------------------------------------ PodDisruptionBudget
def _eviction_allowed(pdb: Obj, replicas: int, ready: int, pod_ready: bool) -> bool:
    """Kubernetes' answer to evicting one engine pod: the disruption controller's arithmetic
    (pkg/controller/disruption: desiredHealthy = expected - maxUnavailable, or minAvailable;
    disruptionsAllowed = max(0, currentHealthy - desiredHealthy)) and the eviction subresource's rule for
    pods that are not Ready (pkg/registry/core/pod/storage/eviction.go: AlwaysAllow, or IfHealthyBudget
    when currentHealthy >= desiredHealthy > 0)."""
    spec = pdb["spec"]

    def scaled(v: int | str) -> int:
        if isinstance(v, str) and v.endswith("%"):
            return -(-int(v[:-1]) * replicas // 100)  # rounded up, as the controller does
        return int(v)

    if "minAvailable" in spec:
        desired = scaled(spec["minAvailable"])
    else:
        desired = replicas - scaled(spec["maxUnavailable"])
    if not pod_ready:
        policy = spec.get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        if policy == "AlwaysAllow" or (ready >= desired > 0):
            return True
    return max(0, ready - desired) > 0


def test_engine_disruption_budget(base: list[Obj]) -> None:
    pdb = one(base, "PodDisruptionBudget", "watchd-engine", "watchd")
    dep = one(base, "Deployment", "watchd-engine", "watchd")
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= dep["spec"]["template"]["metadata"]["labels"].items()
    )
    n = dep["spec"]["replicas"]
    for replicas in (n, n + 1):  # scaling changes nothing
        # steady state: the leader is the one Ready engine; both it and a follower may be evicted
        assert _eviction_allowed(pdb, replicas, ready=1, pod_ready=True)
        assert _eviction_allowed(pdb, replicas, ready=1, pod_ready=False)
        # a fail-over (no engine Ready yet): the survivor is not taken away
        assert not _eviction_allowed(pdb, replicas, ready=0, pod_ready=False)
    # why not the usual budget: with only the leader Ready it could never be evicted (drains hang)
    usual = {"spec": {"maxUnavailable": 1}}
    assert not _eviction_allowed(usual, n, ready=1, pod_ready=True)
