"""Helpers for the tests of deploy/kubernetes: the kustomizations rendered by the real ``kubectl kustomize``
(no cluster, no network), and two checkers written for these tests from the Kubernetes documentation, for the
fields the manifests use: the Pod Security Standards (baseline, restricted) and NetworkPolicy semantics."""

from __future__ import annotations

import functools
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import real_components_required

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
BASE = KUBE / "base"
EXAMPLE = KUBE / "overlays" / "example"

Obj = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        if real_components_required():
            pytest.fail("kubectl is required (kubectl kustomize renders deploy/kubernetes) but not installed")
        pytest.skip("kubectl is not installed (kubectl kustomize renders deploy/kubernetes)")
    return path


@functools.cache
def _render(folder: str) -> tuple[Obj, ...]:
    r = subprocess.run(
        [kubectl(), "kustomize", folder], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, f"kubectl kustomize {folder}: {r.stderr}"
    return tuple(d for d in yaml.safe_load_all(r.stdout) if d)


def render(folder: Path) -> list[Obj]:
    """The objects `kubectl apply -k folder` would send, in the order it sends them."""
    return [dict(d) for d in _render(str(folder))]


def find(objs: list[Obj], kind: str, name: str | None = None, namespace: str | None = None) -> list[Obj]:
    return [
        o
        for o in objs
        if o["kind"] == kind
        and (name is None or o["metadata"]["name"] == name)
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]


def one(objs: list[Obj], kind: str, name: str, namespace: str | None = None) -> Obj:
    found = find(objs, kind, name, namespace)
    assert len(found) == 1, f"{kind} {namespace}/{name}: {len(found)} found"
    return found[0]


def pod_templates(objs: list[Obj]) -> list[tuple[Obj, Obj]]:
    """(workload, its pod template) of every Deployment, DaemonSet, StatefulSet and Job."""
    out = []
    for o in objs:
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            out.append((o, o["spec"]["template"]))
    return out


# ----------------------------------------------------------------------------- Pod Security Standards
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the controls of the current version
# that a pod spec of these manifests can touch; Windows and AppArmor/SELinux options are not used here)
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def _containers(spec: Obj) -> list[Obj]:
    return [
        *spec.get("initContainers", []),
        *spec.get("containers", []),
        *spec.get("ephemeralContainers", []),
    ]


def baseline_violations(spec: Obj) -> list[str]:
    out = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(field)
    pod_sc = spec.get("securityContext") or {}
    for v in spec.get("volumes", []):
        if "hostPath" in v:
            out.append(f"hostPath volume {v['name']}")
    for s in pod_sc.get("sysctls", []):
        if s["name"] not in SAFE_SYSCTLS:
            out.append(f"sysctl {s['name']}")
    if (pod_sc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("seccomp Unconfined")
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        extra = set((sc.get("capabilities") or {}).get("add", [])) - BASELINE_CAPABILITIES
        if extra:
            out.append(f"{c['name']}: adds {sorted(extra)}")
        for p in c.get("ports", []):
            if p.get("hostPort"):
                out.append(f"{c['name']}: hostPort {p['hostPort']}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{c['name']}: procMount")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{c['name']}: seccomp Unconfined")
    return out


def restricted_violations(spec: Obj) -> list[str]:
    out = baseline_violations(spec)
    pod_sc = spec.get("securityContext") or {}
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            out.append(f"{name}: capabilities not dropped (drop: [ALL])")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds {caps['add']}")
    return out


def admitted(level: str, spec: Obj) -> list[str]:
    """What keeps a pod spec out of a namespace whose enforce level is ``level`` (empty: admitted)."""
    if level == "privileged":
        return []
    if level == "baseline":
        return baseline_violations(spec)
    assert level == "restricted", level
    return restricted_violations(spec)


# --------------------------------------------------------------------------------------- NetworkPolicy
@dataclass(frozen=True)
class Peer:
    """A pod, as NetworkPolicies see it."""

    namespace: str
    labels: tuple[tuple[str, str], ...]

    @staticmethod
    def of(namespace: str, labels: dict[str, str]) -> Peer:
        return Peer(namespace, tuple(sorted(labels.items())))


def _selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        have = expr["key"] in labels
        op = expr["operator"]
        if op == "In" and labels.get(expr["key"]) not in expr["values"]:
            return False
        if op == "NotIn" and labels.get(expr["key"]) in expr["values"]:
            return False
        if op == "Exists" and not have:
            return False
        if op == "DoesNotExist" and have:
            return False
    return True


def _peer_matches(rule_peer: Obj, policy_ns: str, peer: Peer, ns_labels: dict[str, dict[str, str]]) -> bool:
    labels = dict(peer.labels)
    if "ipBlock" in rule_peer:
        return False  # pods are reached by their selectors here
    if "namespaceSelector" in rule_peer:
        if not _selects(rule_peer["namespaceSelector"], ns_labels.get(peer.namespace, {})):
            return False
    elif peer.namespace != policy_ns:
        return False
    return "podSelector" not in rule_peer or _selects(rule_peer["podSelector"], labels)


def _port_matches(rule: Obj, port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    if not ports:
        return True
    return any(p.get("protocol", "TCP") == protocol and p.get("port") in (None, port) for p in ports)


def _allowed_side(
    policies: list[Obj],
    direction: str,
    pod: Peer,
    other: Peer | None,
    port: int,
    protocol: str,
    ns_labels: dict[str, dict[str, str]],
) -> bool:
    """Whether ``pod``'s policies of ``direction`` (Ingress/Egress) let traffic to/from ``other`` (None:
    an address outside the cluster) on ``port``: allowed when no policy of that direction selects the pod,
    otherwise when a rule of one of them matches."""
    key = "ingress" if direction == "Ingress" else "egress"
    peers_key = "from" if direction == "Ingress" else "to"
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == pod.namespace
        and direction in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"]["podSelector"], dict(pod.labels))
    ]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get(key) or []:
            if not _port_matches(rule, port, protocol):
                continue
            peers = rule.get(peers_key)
            if not peers:
                return True
            if other is None:
                if any("ipBlock" in r for r in peers):
                    return True
                continue
            if any(_peer_matches(r, pod.namespace, other, ns_labels) for r in peers):
                return True
    return False


def connection_allowed(
    objs: list[Obj], src: Peer | None, dst: Peer | None, port: int, protocol: str = "TCP"
) -> bool:
    """A connection from ``src`` to ``dst``:``port`` passes the egress policies of ``src`` and the ingress
    policies of ``dst`` (None: outside the cluster, where no policy applies)."""
    policies = find(objs, "NetworkPolicy")
    ns_labels = {
        n["metadata"]["name"]: {
            "kubernetes.io/metadata.name": n["metadata"]["name"],
            **(n["metadata"].get("labels") or {}),
        }
        for n in find(objs, "Namespace")
    }
    for name in ("kube-system", "monitoring", "ml", "default"):
        ns_labels.setdefault(name, {"kubernetes.io/metadata.name": name})
    egress_ok = src is None or _allowed_side(policies, "Egress", src, dst, port, protocol, ns_labels)
    ingress_ok = dst is None or _allowed_side(policies, "Ingress", dst, src, port, protocol, ns_labels)
    return egress_ok and ingress_ok
