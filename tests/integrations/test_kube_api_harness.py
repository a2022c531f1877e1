"""The in-process API server keeps the Kubernetes semantics the adapter relies on (raw HTTP, no client)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.harness.kube_api import JSON_PATCH, MERGE, STRATEGIC, KubeApiServer


@pytest.fixture
async def api() -> AsyncIterator[KubeApiServer]:
    async with KubeApiServer(tokens={"t0ken": "watchd"}) as server:
        server.add_node("gpu-1", labels={"pool": "a"})
        server.add_node("gpu-2", labels={"pool": "b"})
        yield server


async def call(
    api: KubeApiServer,
    method: str,
    path: str,
    body: Any = None,
    ctype: str = MERGE,
    token: str | None = "t0ken",
) -> tuple[int, Any]:
    headers = {"Content-Type": ctype}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, api.url + path, json=body, headers=headers) as r,
    ):
        assert r.headers["Content-Type"] == "application/json"
        return r.status, await r.json()


async def test_patch_content_types_and_resource_version(api: KubeApiServer) -> None:
    rv = api.node("gpu-1")["metadata"]["resourceVersion"]
    st, node = await call(api, "PATCH", "/api/v1/nodes/gpu-1", {"spec": {"unschedulable": True}})
    assert st == 200 and node["spec"]["unschedulable"] is True
    assert int(node["metadata"]["resourceVersion"]) > int(rv)
    # a stale resourceVersion is a conflict, and nothing changes
    st, body = await call(
        api,
        "PATCH",
        "/api/v1/nodes/gpu-1",
        {"metadata": {"resourceVersion": rv}, "spec": {"unschedulable": False}},
    )
    assert (st, body["reason"]) == (409, "Conflict")
    assert api.node("gpu-1")["spec"]["unschedulable"] is True
    # merge patch: null deletes
    st, node = await call(api, "PATCH", "/api/v1/nodes/gpu-1", {"spec": {"unschedulable": None}})
    assert "unschedulable" not in node["spec"]
    # json patch, with a failing test op (422, untouched)
    st, body = await call(
        api,
        "PATCH",
        "/api/v1/nodes/gpu-1",
        [
            {"op": "test", "path": "/metadata/name", "value": "other"},
            {"op": "add", "path": "/spec/unschedulable", "value": True},
        ],
        JSON_PATCH,
    )
    assert st == 422 and "unschedulable" not in api.node("gpu-1")["spec"]
    st, node = await call(
        api,
        "PATCH",
        "/api/v1/nodes/gpu-1",
        [{"op": "add", "path": "/spec/taints", "value": [{"key": "a", "effect": "NoSchedule"}]}],
        JSON_PATCH,
    )
    assert st == 200 and node["spec"]["taints"] == [{"key": "a", "effect": "NoSchedule"}]
    # strategic merge: taints have no merge key (replaced); conditions merge by type
    st, node = await call(
        api,
        "PATCH",
        "/api/v1/nodes/gpu-1",
        {
            "spec": {"taints": [{"key": "b", "effect": "NoExecute"}]},
            "status": {"conditions": [{"type": "GpuHealthy", "status": "False"}]},
        },
        STRATEGIC,
    )
    assert node["spec"]["taints"] == [{"key": "b", "effect": "NoExecute"}]
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "GpuHealthy"]
    st, body = await call(api, "PATCH", "/api/v1/nodes/gpu-1", {"spec": {}}, "application/yaml")
    assert st == 415
    st, body = await call(
        api,
        "PATCH",
        "/api/v1/nodes/gpu-1",
        {"spec": {"taints": [{"key": "k", "value": "has space", "effect": "NoSchedule"}]}},
    )
    assert st == 422 and "spec.taints.value" in body["message"]


async def test_auth_denial_and_injection(api: KubeApiServer) -> None:
    assert (await call(api, "GET", "/api/v1/nodes/gpu-1", token=None))[0] == 401
    assert (await call(api, "GET", "/api/v1/nodes/gpu-1", token="wrong"))[0] == 401
    api.deny.add(("watchd", "patch", "nodes"))
    st, body = await call(api, "PATCH", "/api/v1/nodes/gpu-1", {"spec": {}})
    assert st == 403 and 'cannot patch resource "nodes"' in body["message"]
    api.inject(503, method="GET", path="/nodes/gpu-2", times=1)
    assert (await call(api, "GET", "/api/v1/nodes/gpu-2"))[0] == 503
    assert (await call(api, "GET", "/api/v1/nodes/gpu-2"))[0] == 200
    assert (await call(api, "GET", "/api/v1/nodes/nope"))[0] == 404
    assert [(c.verb, c.resource) for c in api.calls[-3:]] == [("get", "nodes")] * 3


async def test_selectors(api: KubeApiServer) -> None:
    api.add_pod("ml", "a", "gpu-1", labels={"app": "x", "tier": "1"})
    api.add_pod("ml", "b", "gpu-2", labels={"app": "x"})
    api.add_pod("ops", "c", "gpu-1", labels={"app": "y"}, phase="Succeeded")

    async def names(path: str) -> list[str]:
        st, body = await call(api, "GET", path)
        assert st == 200, body
        return sorted(p["metadata"]["name"] for p in body["items"])

    assert await names("/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-1") == ["a", "c"]
    assert await names("/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-1,status.phase!%3DSucceeded") == ["a"]
    assert await names("/api/v1/namespaces/ml/pods?labelSelector=app%3Dx,tier") == ["a"]
    assert await names("/api/v1/pods?labelSelector=app%20in%20(x,y),!tier") == ["b", "c"]
    st, body = await call(api, "GET", "/api/v1/pods?fieldSelector=spec.bogus%3D1")
    assert st == 400
    st, body = await call(api, "GET", "/api/v1/nodes?labelSelector=pool%3Db")
    assert [n["metadata"]["name"] for n in body["items"]] == ["gpu-2"]


async def test_eviction_honours_disruption_budgets(api: KubeApiServer) -> None:
    for i in range(3):
        api.add_pod("ml", f"web-{i}", "gpu-1", labels={"app": "web"})
    api.add_pdb("ml", "web", {"app": "web"}, max_unavailable="34%")  # ceil(0.34*3) = 2 may go
    ev = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-0", "namespace": "ml"}}
    assert (await call(api, "POST", "/api/v1/namespaces/ml/pods/web-0/eviction", ev))[0] == 201
    ev["metadata"]["name"] = "web-1"
    assert (await call(api, "POST", "/api/v1/namespaces/ml/pods/web-1/eviction", ev))[0] == 201
    # the budget counts what is left: 1 of 1 expected, max 1 unavailable -> allowed = 1 - 0 ... but only
    # healthy pods matter; add a replacement that is not running yet: healthy 1, expected 2, needs 1
    api.add_pod("ml", "web-3", "gpu-2", labels={"app": "web"}, phase="Pending")
    ev["metadata"]["name"] = "web-2"
    st, body = await call(api, "POST", "/api/v1/namespaces/ml/pods/web-2/eviction", ev)
    assert (st, body["reason"]) == (429, "TooManyRequests")
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    # a pod that is not running may always go
    ev["metadata"]["name"] = "web-3"
    assert (await call(api, "POST", "/api/v1/namespaces/ml/pods/web-3/eviction", ev))[0] == 201
    assert (await call(api, "POST", "/api/v1/namespaces/ml/pods/gone/eviction", ev))[
        0
    ] == 400  # name mismatch
    ev["metadata"]["name"] = "gone"
    assert (await call(api, "POST", "/api/v1/namespaces/ml/pods/gone/eviction", ev))[0] == 404
    api.add_pdb("ml", "web2", {"app": "web"}, min_available=0)
    ev["metadata"]["name"] = "web-2"
    assert (await call(api, "POST", "/api/v1/namespaces/ml/pods/web-2/eviction", ev))[0] == 500  # two budgets


async def test_leases_optimistic_concurrency(api: KubeApiServer) -> None:
    base = "/apis/coordination.k8s.io/v1/namespaces/watchd/leases"
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l"},
        "spec": {"holderIdentity": "a"},
    }
    st, created = await call(api, "POST", base, lease)
    assert st == 201
    assert (await call(api, "POST", base, lease))[1]["reason"] == "AlreadyExists"
    created["spec"]["holderIdentity"] = "b"
    st, updated = await call(api, "PUT", base + "/l", created)
    assert st == 200 and updated["spec"]["holderIdentity"] == "b"
    created["spec"]["holderIdentity"] = "c"  # the old resourceVersion: the other writer won
    assert (await call(api, "PUT", base + "/l", created))[0] == 409
    assert (
        await call(
            api, "PUT", base + "/nope", {**created, "metadata": {"name": "nope", "resourceVersion": "1"}}
        )
    )[0] == 404
    assert (await call(api, "GET", base + "/l"))[1]["spec"]["holderIdentity"] == "b"
    assert [c.verb for c in api.calls if c.resource == "leases"] == [
        "create",
        "create",
        "update",
        "update",
        "update",
        "get",
    ]
