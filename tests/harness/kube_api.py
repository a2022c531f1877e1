"""An in-process Kubernetes API server for tests: the subset watchd uses, with real semantics.

No API server can be installed here, so the Kubernetes adapter is tested against this one, over real HTTP on
loopback, with the real client library. What it implements, as the real API server does:

- nodes: GET, LIST (``labelSelector``), PATCH with ``application/merge-patch+json`` (RFC 7386),
  ``application/strategic-merge-patch+json`` (merge patch whose keyed lists merge by key, ``$patch: delete``)
  and ``application/json-patch+json`` (RFC 6902, ``test`` included); any other content type is 415. Every
  write bumps ``metadata.resourceVersion`` (one counter for the whole store, as etcd's revision); a patch
  carrying a stale ``metadata.resourceVersion`` is 409 Conflict. Taints are validated (422 Invalid).
- pods: LIST across or within namespaces with ``fieldSelector`` (``spec.nodeName``, ``status.phase``,
  ``metadata.name``, ``metadata.namespace``; ``=``, ``==``, ``!=``) and ``labelSelector`` (``k=v``, ``k!=v``,
  ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``), DELETE, and the ``eviction`` subresource (policy/v1):
  429 while a PodDisruptionBudget forbids the disruption (``minAvailable`` / ``maxUnavailable``, integers or
  percentages rounded up, over the healthy pods its selector matches), 500 when two budgets match the pod.
- leases (coordination.k8s.io/v1): GET, POST (409 AlreadyExists), PUT with optimistic concurrency (409 on a
  stale resourceVersion, 404 on a lease that does not exist).
- jobs (batch/v1, issue 21): POST (409 AlreadyExists, 422 without a pod template), GET, DELETE (the
  Job's pods go with it, as with ``propagationPolicy`` Background or Foreground); creating a Job creates its
  Pod as the Job controller does (``<job>-<suffix>``, labels ``job-name``/``batch.kubernetes.io/job-name``,
  an owner reference, phase ``Pending``), the test plays the kubelet with :meth:`KubeApiServer.run_job` /
  :meth:`KubeApiServer.finish_job`, and ``activeDeadlineSeconds`` is enforced as the controller does (past
  it the Job fails with reason ``DeadlineExceeded`` and its running pods are deleted); pod logs
  (``GET pods/{name}/log``, plain text).
- errors as ``Status`` objects; bearer-token authentication (401) and per-verb/resource denial (403);
  injectable failures (any status, a delay for timeouts) for the next N matching requests.

Every request is recorded (method, path, content type, verb and resource as RBAC names them), so tests can
check that the RBAC manifests cover every call the adapter makes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import math
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# Lists a strategic merge patch merges by key (the subset of the Go struct tags the tests touch).
_MERGE_KEYS = {("metadata", "ownerReferences"): "uid", ("status", "conditions"): "type"}
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}


class ApiFailure(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status_body(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


@dataclass
class Injected:
    status: int
    method: str | None
    path: str | None  # a regular expression searched in the path
    times: int
    delay: float = 0.0
    message: str = "injected failure"


@dataclass
class Call:
    method: str
    path: str
    verb: str
    resource: str  # "nodes", "pods", "pods/eviction", "leases"
    group: str  # "" (core), "coordination.k8s.io", "policy"
    content_type: str
    status: int = 0
    at: float = 0.0  # time.time() when the request arrived
    user: str = ""


@dataclass
class PDB:
    namespace: str
    name: str
    match_labels: dict[str, str]
    min_available: int | str | None = None
    max_unavailable: int | str | None = None


@dataclass
class KubeState:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pdbs: list[PDB] = field(default_factory=list)
    jobs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    logs: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, pod) -> its log
    job_started: dict[tuple[str, str], float] = field(default_factory=dict)  # for activeDeadlineSeconds
    revision: int = 1000

    def bump(self, obj: dict[str, Any]) -> None:
        self.revision += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.revision)


class KubeApiServer:
    """``async with KubeApiServer() as api:`` serves on ``api.url``; ``api.state`` holds the objects.

    ``tokens`` maps accepted bearer tokens to a user name (empty: no authentication); ``deny`` holds
    ``(user, verb, resource)`` triples answered 403."""

    def __init__(
        self, *, tokens: dict[str, str] | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.state = KubeState()
        self.tokens = tokens or {}
        self.deny: set[tuple[str, str, str]] = set()
        self.calls: list[Call] = []
        self.injected: list[Injected] = []
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None
        self._uid = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------------------------------ setup
    def add_node(
        self,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        unschedulable: bool = False,
        taints: list[dict[str, str]] | None = None,
        annotations: dict[str, str] | None = None,
        ready: bool = True,
        gpus: int = 8,
    ) -> dict[str, Any]:
        node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": self._new_uid(),
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                "annotations": dict(annotations or {}),
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {},
            "status": {
                "capacity": {"nvidia.com/gpu": str(gpus)},
                "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}],
                "nodeInfo": {  # as a kubelet reports it: bootID changes with every boot
                    "architecture": "amd64",
                    "bootID": self._new_uid(),
                    "containerRuntimeVersion": "containerd://1.7.24",
                    "kernelVersion": "6.8.0",
                    "kubeProxyVersion": "v1.31.4",
                    "kubeletVersion": "v1.31.4",
                    "machineID": name,
                    "operatingSystem": "linux",
                    "osImage": "Ubuntu 24.04.1 LTS",
                    "systemUUID": name,
                },
            },
        }
        if unschedulable:
            node["spec"]["unschedulable"] = True
        if taints:
            node["spec"]["taints"] = list(taints)
        self.state.bump(node)
        self.state.nodes[name] = node
        return node

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        *,
        labels: dict[str, str] | None = None,
        owner: tuple[str, str] | None = None,  # (kind, name)
        gpus: int = 0,
        phase: str = "Running",
        annotations: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": "train:latest"}
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "uid": self._new_uid(),
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        }
        if owner is not None:
            meta["ownerReferences"] = [
                {
                    "apiVersion": _owner_api(owner[0]),
                    "kind": owner[0],
                    "name": owner[1],
                    "uid": self._new_uid(),
                    "controller": True,
                }
            ]
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"nodeName": node, "containers": [container]},
            "status": {"phase": phase},
        }
        self.state.bump(pod)
        self.state.pods[(namespace, name)] = pod
        return pod

    def add_pdb(
        self,
        namespace: str,
        name: str,
        match_labels: dict[str, str],
        *,
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
    ) -> PDB:
        pdb = PDB(namespace, name, match_labels, min_available, max_unavailable)
        self.state.pdbs.append(pdb)
        return pdb

    def inject(
        self,
        status: int,
        *,
        method: str | None = None,
        path: str | None = None,
        times: int = 1,
        delay: float = 0.0,
        message: str = "injected failure",
    ) -> None:
        """Answer the next ``times`` requests matching ``method`` and ``path`` (a regex) with ``status``
        (after ``delay`` seconds; status 0 with a delay only delays them)."""
        self.injected.append(Injected(status, method, path, times, delay, message))

    def node(self, name: str) -> dict[str, Any]:
        return self.state.nodes[name]

    def writes(self, resource: str | None = None) -> list[Call]:
        return [
            c
            for c in self.calls
            if c.verb in ("patch", "create", "update", "delete")
            and (resource is None or c.resource == resource)
            and c.status < 400
        ]

    def _new_uid(self) -> str:
        self._uid += 1
        return f"00000000-0000-0000-0000-{self._uid:012d}"

    # ------------------------------------------------------------------------------------------ serving
    async def __aenter__(self) -> KubeApiServer:
        app = web.Application(middlewares=[self._middleware], client_max_size=16 * 1024 * 1024)
        r = app.router
        r.add_get("/api/v1/nodes", self._list_nodes)
        r.add_get("/api/v1/nodes/{name}", self._get_node)
        r.add_patch("/api/v1/nodes/{name}", self._patch_node)
        r.add_get("/api/v1/pods", self._list_pods)
        r.add_get("/api/v1/namespaces/{ns}/pods", self._list_pods)
        r.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        r.add_delete("/api/v1/namespaces/{ns}/pods/{name}", self._delete_pod)
        r.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self._patch_pod)
        r.add_post("/api/v1/namespaces/{ns}/pods/{name}/eviction", self._evict)
        r.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", self._pod_log)
        jobs = "/apis/batch/v1/namespaces/{ns}/jobs"
        r.add_post(jobs, self._create_job)
        r.add_get(jobs + "/{name}", self._get_job)
        r.add_delete(jobs + "/{name}", self._delete_job)
        r.add_post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", self._access_review)
        lease = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        r.add_post(lease, self._create_lease)
        r.add_get(lease + "/{name}", self._get_lease)
        r.add_put(lease + "/{name}", self._replace_lease)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def kubeconfig(self, token: str | None = None, namespace: str = "default") -> dict[str, Any]:
        user: dict[str, Any] = {"token": token} if token else {}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": user}],
            "contexts": [
                {"name": "test", "context": {"cluster": "test", "user": "test", "namespace": namespace}}
            ],
            "current-context": "test",
        }

    def write_kubeconfig(self, directory: Path, token: str | None = None) -> Path:
        """:meth:`kubeconfig` written to ``directory/kubeconfig``, as the client library reads it."""
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump(self.kubeconfig(token)))
        return path

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        verb, resource, group = _rbac_of(request)
        call = Call(
            request.method,
            request.path,
            verb,
            resource,
            group,
            request.headers.get("Content-Type", "").split(";")[0].strip(),
            at=time.time(),
        )
        self.calls.append(call)
        try:
            if self.tokens:
                auth = request.headers.get("Authorization", "")
                user = self.tokens.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None
                if user is None:
                    raise ApiFailure(401, "Unauthorized", "Unauthorized")
                call.user = user
            for inj in self.injected:
                if (
                    inj.times > 0
                    and (inj.method is None or inj.method == request.method)
                    and (inj.path is None or re.search(inj.path, request.path))
                ):
                    inj.times -= 1
                    if inj.delay:
                        await asyncio.sleep(inj.delay)
                    if inj.status:
                        raise ApiFailure(inj.status, _reason_of(inj.status), inj.message)
                    break
            if (call.user, verb, resource) in self.deny or ("*", verb, resource) in self.deny:
                raise ApiFailure(
                    403,
                    "Forbidden",
                    f'{resource} is forbidden: User "{call.user or "anonymous"}" '
                    f'cannot {verb} resource "{resource}" in API group "{group}"',
                )
            response: web.StreamResponse = await handler(request)
        except ApiFailure as f:
            response = _json(status_body(f.code, f.reason, f.message, f.details), status=f.code)
        except web.HTTPException as exc:
            response = _json(status_body(exc.status, exc.reason, exc.reason), status=exc.status)
        call.status = response.status
        return response

    # ------------------------------------------------------------------------------------------ nodes
    def _node_or_404(self, name: str) -> dict[str, Any]:
        node = self.state.nodes.get(name)
        if node is None:
            raise ApiFailure(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
        return node

    async def _get_node(self, request: web.Request) -> web.Response:
        return _json(self._node_or_404(request.match_info["name"]))

    async def _list_nodes(self, request: web.Request) -> web.Response:
        selector = parse_label_selector(request.query.get("labelSelector", ""))
        items = [
            n for n in self.state.nodes.values() if matches_labels(selector, n["metadata"].get("labels", {}))
        ]
        return _json(
            {
                "kind": "NodeList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.state.revision)},
                "items": items,
            }
        )

    async def _patch_node(self, request: web.Request) -> web.Response:
        node = self._node_or_404(request.match_info["name"])
        patched = apply_patch(node, request.headers.get("Content-Type", ""), await _body(request))
        _check_rv(node, patched, "nodes")
        for taint in patched.get("spec", {}).get("taints") or []:
            _validate_taint(taint, node["metadata"]["name"])
        patched["metadata"]["name"] = node["metadata"]["name"]
        patched["metadata"]["uid"] = node["metadata"]["uid"]
        self.state.bump(patched)
        self.state.nodes[node["metadata"]["name"]] = patched
        return _json(patched)

    # ------------------------------------------------------------------------------------------ pods
    def _pod_or_404(self, ns: str, name: str) -> dict[str, Any]:
        pod = self.state.pods.get((ns, name))
        if pod is None:
            raise ApiFailure(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        return pod

    async def _list_pods(self, request: web.Request) -> web.Response:
        ns = request.match_info.get("ns")
        labels = parse_label_selector(request.query.get("labelSelector", ""))
        fields = parse_field_selector(request.query.get("fieldSelector", ""))
        items = [
            p
            for (pns, _), p in self.state.pods.items()
            if (ns is None or pns == ns)
            and matches_labels(labels, p["metadata"].get("labels", {}))
            and matches_fields(fields, p)
        ]
        return _json(
            {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.state.revision)},
                "items": items,
            }
        )

    async def _get_pod(self, request: web.Request) -> web.Response:
        return _json(self._pod_or_404(request.match_info["ns"], request.match_info["name"]))

    async def _delete_pod(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self._pod_or_404(ns, name)
        del self.state.pods[(ns, name)]
        return _json(pod)

    async def _patch_pod(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self._pod_or_404(ns, name)
        patched = apply_patch(pod, request.headers.get("Content-Type", ""), await _body(request))
        _check_rv(pod, patched, "pods")
        self.state.bump(patched)
        self.state.pods[(ns, name)] = patched
        return _json(patched)

    async def _access_review(self, request: web.Request) -> web.Response:
        """SelfSubjectAccessReview, answered from the same RBAC the other routes enforce (``deny``): never
        forbidden itself (every authenticated user may ask about themselves), created but not stored."""
        body = await _body(request)
        attrs = (body.get("spec") or {}).get("resourceAttributes") if isinstance(body, dict) else None
        if body.get("kind") != "SelfSubjectAccessReview" or not isinstance(attrs, dict):
            raise ApiFailure(400, "BadRequest", "spec.resourceAttributes: required")
        user = self.calls[-1].user
        verb = str(attrs.get("verb", ""))
        resource = str(attrs.get("resource", "")) + (
            f"/{attrs['subresource']}" if attrs.get("subresource") else ""
        )
        denied = (user, verb, resource) in self.deny or ("*", verb, resource) in self.deny
        status = {"allowed": not denied}
        if denied:
            status["reason"] = f'RBAC: no rule lets "{user or "anonymous"}" {verb} {resource}'
        return _json({**body, "status": status}, status=201)

    async def _evict(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        body = await _body(request)
        if not isinstance(body, dict) or body.get("kind") != "Eviction":
            raise ApiFailure(400, "BadRequest", "the body of the request was not an Eviction")
        if body.get("metadata", {}).get("name") not in (None, name):
            raise ApiFailure(400, "BadRequest", "name in URL does not match name in Eviction object")
        pod = self._pod_or_404(ns, name)
        labels = pod["metadata"].get("labels", {})
        budgets = [
            b
            for b in self.state.pdbs
            if b.namespace == ns
            and matches_labels([(k, "=", [v]) for k, v in b.match_labels.items()], labels)
        ]
        if len(budgets) > 1:
            raise ApiFailure(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                "does not support.",
            )
        # a pod that is not running does not count as healthy and may always go (as the real API server)
        if budgets and pod["status"].get("phase") == "Running":
            allowed = self.disruptions_allowed(budgets[0])
            if allowed <= 0:
                raise ApiFailure(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {budgets[0].name} needs "
                                f"{self._healthy_needed(budgets[0])} healthy pods and has "
                                f"{len(self._healthy(budgets[0]))} currently",
                            }
                        ]
                    },
                )
        del self.state.pods[(ns, name)]
        return _json(status_body(201, "", ""), status=201)

    def _matching(self, b: PDB) -> list[dict[str, Any]]:
        sel = [(k, "=", [v]) for k, v in b.match_labels.items()]
        return [
            p
            for (ns, _), p in self.state.pods.items()
            if ns == b.namespace and matches_labels(sel, p["metadata"].get("labels", {}))
        ]

    def _healthy(self, b: PDB) -> list[dict[str, Any]]:
        return [p for p in self._matching(b) if p["status"].get("phase") == "Running"]

    def _healthy_needed(self, b: PDB) -> int:
        expected = len(self._matching(b))
        if b.min_available is not None:
            return _scaled(b.min_available, expected)
        assert b.max_unavailable is not None
        return expected - _scaled(b.max_unavailable, expected)

    def disruptions_allowed(self, b: PDB) -> int:
        """As the disruption controller computes ``status.disruptionsAllowed``."""
        return max(0, len(self._healthy(b)) - self._healthy_needed(b))

    # ------------------------------------------------------------------------------------------ leases
    # ------------------------------------------------------------------------------------------ jobs
    def _job_or_404(self, ns: str, name: str) -> dict[str, Any]:
        job = self.state.jobs.get((ns, name))
        if job is None:
            raise ApiFailure(
                404, "NotFound", f'jobs.batch "{name}" not found', {"name": name, "kind": "jobs"}
            )
        return job

    def _job_pods(self, ns: str, name: str) -> list[dict[str, Any]]:
        return [
            p
            for (pns, _), p in self.state.pods.items()
            if pns == ns and p["metadata"].get("labels", {}).get("job-name") == name
        ]

    async def _create_job(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        body = await _body(request)
        meta = body.get("metadata", {}) if isinstance(body, dict) else {}
        name = meta.get("name")
        template = (body.get("spec") or {}).get("template") if isinstance(body, dict) else None
        if not name or not isinstance(template, dict) or not (template.get("spec") or {}).get("containers"):
            raise ApiFailure(
                422, "Invalid", "Job.batch is invalid: spec.template.spec.containers: Required value"
            )
        if (ns, name) in self.state.jobs:
            raise ApiFailure(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
        job = copy.deepcopy(body)
        job["metadata"] = {**meta, "namespace": ns, "uid": self._new_uid(), "creationTimestamp": _now_iso()}
        job["status"] = {}
        self.state.bump(job)
        self.state.jobs[(ns, name)] = job
        # the Job controller: one pod from the template
        pod_spec = copy.deepcopy(template["spec"])
        labels = {
            **(template.get("metadata") or {}).get("labels", {}),
            "job-name": name,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": job["metadata"]["uid"],
        }
        pod_name = f"{name}-{self._uid:05x}"[-63:]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "uid": self._new_uid(),
                "labels": labels,
                "annotations": {},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": pod_spec,
            "status": {"phase": "Pending"},
        }
        self.state.bump(pod)
        self.state.pods[(ns, pod_name)] = pod
        return _json(job, status=201)

    def _enforce_deadline(self, ns: str, name: str) -> None:
        job = self.state.jobs[(ns, name)]
        deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
        started = self.state.job_started.get((ns, name))
        status = job["status"]
        if deadline is None or started is None or status.get("conditions"):
            return
        if time.time() - started > float(deadline):
            for pod in self._job_pods(ns, name):
                del self.state.pods[(ns, pod["metadata"]["name"])]
            status.update(
                active=0,
                failed=1,
                conditions=[
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "DeadlineExceeded",
                        "message": "Job was active longer than specified deadline",
                    }
                ],
            )
            self.state.bump(job)

    async def _get_job(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        self._job_or_404(ns, name)
        self._enforce_deadline(ns, name)
        return _json(self.state.jobs[(ns, name)])

    async def _delete_job(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        job = self._job_or_404(ns, name)
        del self.state.jobs[(ns, name)]
        for pod in self._job_pods(ns, name):
            del self.state.pods[(ns, pod["metadata"]["name"])]
        return _json(job)

    async def _pod_log(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self._pod_or_404(ns, name)
        if pod["status"].get("phase") == "Pending":
            raise ApiFailure(400, "BadRequest", f'container "check" in pod "{name}" is waiting to start')
        resp = web.Response(body=self.state.logs.get((ns, name), "").encode())
        resp.headers["Content-Type"] = "text/plain"
        return resp

    def run_job(self, namespace: str, name: str) -> None:
        """The kubelet starts the Job's pod."""
        job = self.state.jobs[(namespace, name)]
        for pod in self._job_pods(namespace, name):
            pod["status"] = {"phase": "Running"}
            self.state.bump(pod)
        job["status"].update(active=1, startTime=_now_iso())
        self.state.job_started[(namespace, name)] = time.time()
        self.state.bump(job)

    def finish_job(self, namespace: str, name: str, output: str, exit_code: int = 0) -> None:
        """The pod's container ends with ``exit_code`` having printed ``output``; the Job controller marks the
        Job Complete (0) or Failed (BackoffLimitExceeded: watchd's Jobs have backoffLimit 0)."""
        job = self.state.jobs[(namespace, name)]
        if (namespace, name) not in self.state.job_started:
            self.run_job(namespace, name)
        for pod in self._job_pods(namespace, name):
            pod["status"] = {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "containerStatuses": [
                    {
                        "name": pod["spec"]["containers"][0].get("name", "check"),
                        "image": pod["spec"]["containers"][0].get("image", ""),
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": exit_code,
                                "reason": "Completed" if exit_code == 0 else "Error",
                            }
                        },
                    }
                ],
            }
            self.state.logs[(namespace, pod["metadata"]["name"])] = output
            self.state.bump(pod)
        cond = (
            {"type": "Complete", "status": "True"}
            if exit_code == 0
            else {
                "type": "Failed",
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
            }
        )
        job["status"].update(
            active=0, succeeded=int(exit_code == 0), failed=int(exit_code != 0), conditions=[cond]
        )
        self.state.bump(job)

    def _lease_or_404(self, ns: str, name: str) -> dict[str, Any]:
        lease = self.state.leases.get((ns, name))
        if lease is None:
            raise ApiFailure(
                404,
                "NotFound",
                f'leases.coordination.k8s.io "{name}" not found',
                {"name": name, "group": "coordination.k8s.io", "kind": "leases"},
            )
        return lease

    async def _get_lease(self, request: web.Request) -> web.Response:
        return _json(self._lease_or_404(request.match_info["ns"], request.match_info["name"]))

    async def _create_lease(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        body = await _body(request)
        name = body.get("metadata", {}).get("name")
        if not name:
            raise ApiFailure(422, "Invalid", "metadata.name: Required value")
        if (ns, name) in self.state.leases:
            raise ApiFailure(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists')
        lease = copy.deepcopy(body)
        lease["metadata"]["namespace"] = ns
        lease["metadata"]["uid"] = self._new_uid()
        self.state.bump(lease)
        self.state.leases[(ns, name)] = lease
        return _json(lease, status=201)

    async def _replace_lease(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        current = self._lease_or_404(ns, name)
        body = await _body(request)
        rv = body.get("metadata", {}).get("resourceVersion")
        if not rv:
            raise ApiFailure(
                422,
                "Invalid",
                "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
            )
        if rv != current["metadata"]["resourceVersion"]:
            raise ApiFailure(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on leases.coordination.k8s.io "
                f'"{name}": the object has been modified; please apply your changes to the latest '
                f"version and try again",
            )
        lease = copy.deepcopy(body)
        lease["metadata"].update(namespace=ns, name=name, uid=current["metadata"]["uid"])
        self.state.bump(lease)
        self.state.leases[(ns, name)] = lease
        return _json(lease)


# ---------------------------------------------------------------------------------------------- helpers
def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _json(body: Any, status: int = 200) -> web.Response:
    # exactly "application/json" as the API server sends it (clients compare the header, charset and all)
    resp = web.Response(body=json.dumps(body).encode(), status=status)
    resp.headers["Content-Type"] = "application/json"
    return resp


async def _body(request: web.Request) -> Any:
    try:
        return json.loads(await request.read() or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiFailure(400, "BadRequest", f"the body could not be decoded: {exc}") from None


def _owner_api(kind: str) -> str:
    return {
        "Job": "batch/v1",
        "DaemonSet": "apps/v1",
        "ReplicaSet": "apps/v1",
        "StatefulSet": "apps/v1",
        "JobSet": "jobset.x-k8s.io/v1alpha2",
        "PyTorchJob": "kubeflow.org/v1",
        "Node": "v1",
    }.get(kind, "v1")


def _reason_of(code: int) -> str:
    return {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        409: "Conflict",
        422: "Invalid",
        429: "TooManyRequests",
        500: "InternalError",
        503: "ServiceUnavailable",
        504: "Timeout",
    }.get(code, "Unknown")


def _rbac_of(request: web.Request) -> tuple[str, str, str]:
    """The verb, resource (with subresource) and API group an RBAC rule would have to allow."""
    parts = [p for p in request.path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return request.method.lower(), request.path, ""
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    resource = rest[0] if rest else ""
    named = len(rest) >= 2
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    verb = {
        "GET": "get" if named else "list",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete",
    }.get(request.method, request.method.lower())
    if resource == "pods/eviction":
        group = "" if group == "" else group
    return verb, resource, group


def _scaled(value: int | str, total: int) -> int:
    if isinstance(value, int):
        return value
    return math.ceil(int(value.rstrip("%")) * total / 100)


def _check_rv(current: dict[str, Any], patched: dict[str, Any], kind: str) -> None:
    rv = patched.get("metadata", {}).get("resourceVersion")
    if rv is not None and rv != current["metadata"]["resourceVersion"]:
        name = current["metadata"]["name"]
        raise ApiFailure(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {kind} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
        )


def _validate_taint(taint: Any, node: str) -> None:
    problems = []
    if not isinstance(taint, dict) or not _QUALIFIED.match(str(taint.get("key", ""))):
        problems.append(
            f"spec.taints.key: Invalid value: {taint.get('key') if isinstance(taint, dict) else taint!r}"
        )
    elif not _LABEL_VALUE.match(str(taint.get("value", ""))):
        problems.append(
            f"spec.taints.value: Invalid value: {taint.get('value')!r}: a valid label must be an empty "
            "string or consist of alphanumeric characters, '-', '_' or '.' (at most 63)"
        )
    elif taint.get("effect") not in _EFFECTS:
        problems.append(f"spec.taints.effect: Unsupported value: {taint.get('effect')!r}")
    if problems:
        raise ApiFailure(422, "Invalid", f'Node "{node}" is invalid: {"; ".join(problems)}')


def apply_patch(obj: dict[str, Any], content_type: str, patch: Any) -> dict[str, Any]:
    kind = content_type.split(";")[0].strip()
    if kind == MERGE:
        return _merge(copy.deepcopy(obj), patch, strategic=False, path=())
    if kind == STRATEGIC:
        return _merge(copy.deepcopy(obj), patch, strategic=True, path=())
    if kind == JSON_PATCH:
        return _json_patch(copy.deepcopy(obj), patch)
    raise ApiFailure(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted "
        f"media types include: {JSON_PATCH}, {MERGE}, {STRATEGIC}, application/apply-patch+yaml",
    )


def _merge(target: Any, patch: Any, *, strategic: bool, path: tuple[str, ...]) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if strategic and key == "$patch":
            continue
        if value is None:
            target.pop(key, None)
        elif strategic and isinstance(value, list) and (*path, key) in _MERGE_KEYS:
            target[key] = _merge_list(target.get(key) or [], value, _MERGE_KEYS[(*path, key)])
        else:
            target[key] = _merge(target.get(key), value, strategic=strategic, path=(*path, key))
    return target


def _merge_list(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    out = [copy.deepcopy(item) for item in current]
    for item in patch:
        idx = next((i for i, c in enumerate(out) if c.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
        elif idx is None:
            out.append(copy.deepcopy(item))
        else:
            out[idx] = _merge(out[idx], item, strategic=True, path=())
    return out


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ApiFailure(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch(doc: dict[str, Any], ops: Any) -> dict[str, Any]:
    if not isinstance(ops, list):
        raise ApiFailure(400, "BadRequest", "json patch must be a list of operations")
    for op in ops:
        parts = _pointer(op.get("path", ""))
        parent: Any = doc
        for p in parts[:-1]:
            try:
                parent = parent[int(p)] if isinstance(parent, list) else parent[p]
            except (KeyError, IndexError, ValueError):
                raise ApiFailure(
                    422, "Invalid", f"the server rejected our request: doc is missing path: {op.get('path')}"
                ) from None
        last, name = parts[-1], op.get("op")
        try:
            if name == "test":
                value = parent[int(last)] if isinstance(parent, list) else parent[last]
                if value != op.get("value"):
                    raise ApiFailure(
                        422,
                        "Invalid",
                        f"the server rejected our request: testing value {op.get('path')} failed",
                    )
            elif name in ("add", "replace"):
                if isinstance(parent, list):
                    idx = len(parent) if last == "-" else int(last)
                    if name == "add":
                        parent.insert(idx, op["value"])
                    else:
                        parent[idx] = op["value"]
                else:
                    if name == "replace" and last not in parent:
                        raise KeyError(last)
                    parent[last] = op["value"]
            elif name == "remove":
                if isinstance(parent, list):
                    parent.pop(int(last))
                else:
                    del parent[last]
            else:
                raise ApiFailure(422, "Invalid", f"unsupported json patch op {name!r}")
        except (KeyError, IndexError, ValueError):
            raise ApiFailure(
                422, "Invalid", f"the server rejected our request: doc is missing path: {op.get('path')}"
            ) from None
    return doc


Selector = list[tuple[str, str, list[str]]]  # (key, op, values); op: = != exists !exists in notin


def parse_label_selector(text: str) -> Selector:
    out: Selector = []
    for part in re.findall(r"[^,(]+(?:\([^)]*\))?", text):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", part)
        if m:
            out.append((m.group(1), m.group(2), [v.strip() for v in m.group(3).split(",")]))
        elif "!=" in part:
            k, v = part.split("!=", 1)
            out.append((k.strip(), "!=", [v.strip()]))
        elif "=" in part:
            k, v = part.split("==", 1) if "==" in part else part.split("=", 1)
            out.append((k.strip(), "=", [v.strip()]))
        elif part.startswith("!"):
            out.append((part[1:].strip(), "!exists", []))
        else:
            out.append((part, "exists", []))
    return out


def matches_labels(selector: Selector, labels: dict[str, str]) -> bool:
    for key, op, values in selector:
        have = labels.get(key)
        if op == "=":
            ok = have is not None and have == values[0]
        elif op == "!=":
            ok = have != values[0]
        elif op == "exists":
            ok = have is not None
        elif op == "!exists":
            ok = have is None
        elif op == "in":
            ok = have in values
        else:  # notin
            ok = have not in values
        if not ok:
            return False
    return True


_FIELDS = {
    "spec.nodeName": lambda p: p["spec"].get("nodeName", ""),
    "status.phase": lambda p: p["status"].get("phase", ""),
    "metadata.name": lambda p: p["metadata"]["name"],
    "metadata.namespace": lambda p: p["metadata"]["namespace"],
}


def parse_field_selector(text: str) -> Selector:
    out: Selector = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if "!=" in part:
            k, v = part.split("!=", 1)
            op = "!="
        else:
            k, v = part.split("==", 1) if "==" in part else part.split("=", 1)
            op = "="
        if k not in _FIELDS:
            raise ApiFailure(
                400,
                "BadRequest",
                f'"{k}" is not a known field selector: only "metadata.name", '
                f'"metadata.namespace", "spec.nodeName", "status.phase"',
            )
        out.append((k, op, [v]))
    return out


def matches_fields(selector: Selector, pod: dict[str, Any]) -> bool:
    for key, op, values in selector:
        have = _FIELDS[key](pod)
        if (have == values[0]) != (op == "="):
            return False
    return True


@contextlib.contextmanager
def in_thread(**kwargs: Any) -> Iterator[KubeApiServer]:
    """The server on its own event loop in a thread: for tests that block (real processes, time.sleep).
    Set up and read ``state`` from the test's thread between requests (plain dict operations)."""
    loop = asyncio.new_event_loop()
    api = KubeApiServer(**kwargs)
    thread = threading.Thread(target=loop.run_forever, name="kube-api", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(api.__aenter__(), loop).result(10)
    try:
        yield api
    finally:
        asyncio.run_coroutine_threadsafe(api.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def main() -> None:  # pragma: no cover - a manual helper: python -m tests.harness.kube_api --nodes 4
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=6443)
    ap.add_argument("--nodes", type=int, default=4)
    args = ap.parse_args()

    async def serve() -> None:
        async with KubeApiServer(port=args.port) as api:
            for i in range(1, args.nodes + 1):
                api.add_node(f"gpu-{i}")
            print(api.url, flush=True)
            await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":  # pragma: no cover
    main()
