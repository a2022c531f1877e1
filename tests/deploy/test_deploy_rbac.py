"""The engine's RBAC in deploy/kubernetes held to the Kubernetes calls watchd's code makes, both ways:
every call is granted in the scope it is made in, and every grant is used.

Two views of the calls: the source (each lightkube client call in watchd/integrations/kubernetes/, with the
resource class it names, read from the syntax tree), and a run (the real client against the in-process API
server of tests/harness/kube_api.py, recording verb, resource and namespace of each request) through every
path: scheduler, fleet, reboot, job provider, leader election, active checks. The run must reach every call
the source makes, so a new call in the code fails here until the RBAC and this run include it."""

from __future__ import annotations

import ast
import asyncio
import importlib
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.kube_manifests import BASE, Obj, find, one, render
from tests.harness.kube_api import KubeApiServer
from tests.integrations.test_kubernetes_adapter import _job_pods, kubeconfig
from watchd.config import EngineConfig, parse_config

PACKAGE = Path(__file__).resolve().parents[2] / "watchd" / "integrations" / "kubernetes"
CLIENT_VERBS = {
    "get": "get",
    "list": "list",
    "watch": "watch",
    "patch": "patch",
    "apply": "patch",
    "create": "create",
    "replace": "update",
    "delete": "delete",
    "deletecollection": "deletecollection",
    "log": "get",
}
#: allowed to every authenticated user by the built-in ClusterRole system:basic-user: not in watchd's RBAC
BUILT_IN = {("authorization.k8s.io", "selfsubjectaccessreviews", "create")}

Grant = tuple[str, str, str]  # (API group, resource[/subresource], verb)


def _resource_of(cls: Any) -> tuple[str, str]:
    info = cls._api_info
    if info.parent is not None:
        return info.parent.group, f"{info.plural}/{info.action}"
    return info.resource.group, info.plural


def _is_resource(value: Any) -> bool:
    return isinstance(value, type) and hasattr(value, "_api_info")


def source_calls() -> dict[Grant, list[str]]:
    """Each API call in the package's source: (group, resource, verb) -> where it is made."""
    out: dict[Grant, list[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        module = importlib.import_module(f"watchd.integrations.kubernetes.{path.stem}")
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            assigned: dict[str, list[ast.expr]] = {}
            names = dict(vars(module))  # the module's names, and those the function imports itself
            for node in ast.walk(func):
                if isinstance(node, ast.ImportFrom) and node.module:
                    imported = importlib.import_module(node.module)
                    for alias in node.names:
                        names[alias.asname or alias.name] = getattr(imported, alias.name, None)
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            assigned.setdefault(target.id, []).append(node.value)
            for node in ast.walk(func):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                method, receiver = node.func.attr, node.func.value
                named_client = (isinstance(receiver, ast.Name) and receiver.id == "client") or (
                    isinstance(receiver, ast.Attribute) and receiver.attr == "client"
                )
                if not named_client or method not in CLIENT_VERBS:
                    continue
                where = f"{path.name}:{node.lineno} {func.name}"
                if method == "log":
                    grant: Grant = ("", "pods/log", "get")
                else:
                    assert node.args, f"{where}: client.{method}() without a resource"
                    first = node.args[0]
                    exprs = assigned.get(first.id, []) if isinstance(first, ast.Name) else []
                    candidates = {
                        names[n.id]
                        for e in [first, *exprs]
                        for n in ast.walk(e)
                        if isinstance(n, ast.Name) and _is_resource(names.get(n.id))
                    }
                    assert len(candidates) == 1, f"{where}: client.{method}() of which resource? {candidates}"
                    group, resource = _resource_of(candidates.pop())
                    grant = (group, resource, CLIENT_VERBS[method])
                out.setdefault(grant, []).append(where)
    return out


def _namespace(path: str) -> str | None:
    parts = [p for p in path.split("/") if p]
    return parts[parts.index("namespaces") + 1] if "namespaces" in parts else None


def engine_grants(objs: list[Obj]) -> list[tuple[str | None, Grant]]:
    """What the engine's service account may do: (namespace, grant), namespace None for every namespace and
    the cluster-scoped resources (a ClusterRoleBinding)."""
    out = []
    for b in find(objs, "ClusterRoleBinding") + find(objs, "RoleBinding"):
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == "watchd-engine" and s["namespace"] == "watchd"
            for s in b["subjects"]
        ):
            continue
        scope = b["metadata"].get("namespace")
        ref = b["roleRef"]
        role = one(objs, ref["kind"], ref["name"], scope if ref["kind"] == "Role" else None)
        for rule in role["rules"]:
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        assert "*" not in (g, r, v), f"wildcard in {ref['name']}"
                        out.append((scope, (g, r, v)))
    return out


async def exercise(api: KubeApiServer, tmp_path: Path, engine: EngineConfig) -> None:
    """Every path of watchd's Kubernetes code, with the namespaces the shipped config names."""
    from watchd.checks.runner import CheckJob
    from watchd.integrations.kubernetes.checks import KubernetesCheckRunner
    from watchd.integrations.kubernetes.client import make_client
    from watchd.integrations.kubernetes.fleet import KubernetesFleet
    from watchd.integrations.kubernetes.jobs import KubernetesJobProvider
    from watchd.integrations.kubernetes.lease import LeaseElector
    from watchd.integrations.kubernetes.scheduler import KubernetesScheduler

    for i in range(1, 7):
        api.add_node(f"gpu-{i}", labels={"nvidia.com/gpu.product": "H100"})
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
    await k8s.privileges()
    await k8s.pools()
    await k8s.drain({"gpu-1": "Xid 79", "gpu-2": "Xid 79"})
    await k8s.wait_evictions()
    await k8s.reboot("gpu-1", "Xid 79")
    await k8s.requeue_jobs_on("gpu-3")
    k8s.requeue_mode = "annotate"
    await k8s.requeue_jobs_on("gpu-4")
    await k8s.resume("gpu-1")
    await KubernetesJobProvider(k8s.client).running_jobs()
    fleet = KubernetesFleet(k8s)
    await fleet.fleet_nodes()
    await fleet.set_spares("H100", ["gpu-6"])
    await fleet.spares()
    # leader election through a Kubernetes Lease (replicas with their own SQLite state)
    le = engine.kubernetes.leader_election
    el = LeaseElector(
        make_client(kc, in_cluster=False), namespace=le.namespace, name=le.lease_name, identity="x"
    )
    await el.try_acquire_or_renew()
    await el.try_acquire_or_renew()
    await el.client.close()
    # active checks, in the namespace the config names: one passes, one runs past its time, one fails a
    # validation (the node stays cordoned, its drain record updated)
    ns = engine.checks.kubernetes.namespace
    runner = KubernetesCheckRunner(k8s, namespace=ns, poll_interval_s=0.02, grace_s=0.1)
    await runner.availability(["gpu-5"], 60)
    ok = await runner.submit(CheckJob("nccl", "gpu-5", ("true",), 30, "r.1"))
    api.finish_job(ns, ok.job_id, "# Avg bus bandwidth : 480.0\n")
    await runner.wait(ok)
    hung = await runner.submit(CheckJob("nccl", "gpu-5", ("sleep", "9"), 0.05, "r.2"))
    await asyncio.sleep(0.05)
    await runner.wait(hung)  # deleted past its time limit
    await runner.end_validation("gpu-2", False, "nccl 100 GB/s")
    await k8s.aclose()


async def test_rbac_is_what_the_code_calls(tmp_path: Path) -> None:
    objs = render(BASE)
    engine_cm = one(objs, "ConfigMap", "watchd-engine-config", "watchd")["data"]["engine.yaml"]
    engine = parse_config(EngineConfig, yaml.safe_load(engine_cm), "engine")
    async with KubeApiServer() as api:
        await exercise(api, tmp_path, engine)
        calls = [(c, _namespace(c.path)) for c in api.calls]
    used = {(c.group, c.resource, c.verb) for c, _ in calls}
    source = source_calls()
    # the run reached every call in the source, and made no call the source does not show
    assert set(source) - used == set(), f"calls in the code this test never made: {set(source) - used}"
    assert used - set(source) == set(), f"calls made that the source scan missed: {used - set(source)}"

    grants = engine_grants(objs)
    refused = sorted(
        {
            (ns, grant)
            for c, ns in calls
            if (grant := (c.group, c.resource, c.verb)) not in BUILT_IN
            and not any(scope in (None, ns) and g == grant for scope, g in grants)
        },
        key=str,
    )
    assert refused == [], f"calls the RBAC does not allow (namespace, call): {refused}"
    # nothing granted that no call needs, and no namespaced grant where a cluster-wide one covers it
    unused = [
        (scope, g)
        for scope, g in grants
        if not any((c.group, c.resource, c.verb) == g and (scope is None or ns == scope) for c, ns in calls)
    ]
    assert unused == [], f"RBAC grants what the engine never calls: {unused}"
    redundant = [(s, g) for s, g in grants if s is not None and (None, g) in grants]
    assert redundant == [], redundant
    # the namespaced grants are exactly where the config puts the Lease and the check Jobs
    assert {s for s, _ in grants if s is not None} == {
        engine.kubernetes.leader_election.namespace,
        engine.checks.kubernetes.namespace,
    }
    # cluster-wide grants are needed: nodes are cluster-scoped, pods of any namespace are drained/requeued
    assert {(g, r) for s, (g, r, _) in grants if s is None} == {
        ("", "nodes"),
        ("", "pods"),
        ("", "pods/eviction"),
    }


def test_the_agent_has_no_api_access() -> None:
    objs = render(BASE)
    sa = one(objs, "ServiceAccount", "watchd-agent", "watchd-agent")
    assert sa["automountServiceAccountToken"] is False
    pod = one(objs, "DaemonSet", "watchd-agent")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    for b in find(objs, "ClusterRoleBinding") + find(objs, "RoleBinding"):
        assert all(s["name"] != "watchd-agent" for s in b["subjects"])
