"""``watchd drains`` and the hot spares on Kubernetes: the real client (lightkube) against the in-process API
server (tests/harness/kube_api.py): cordons by watchd and by others, the control plane's taints, and the
spare taint set and removed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.harness.kube_api import KubeApiServer
from watchd.fleetview.drains import unavailable_nodes
from watchd.integrations.base import SchedulerError
from watchd.integrations.fleet import fleet_backends
from watchd.integrations.kubernetes.client import make_client
from watchd.integrations.kubernetes.fleet import SPARE_TAINT, KubernetesFleet
from watchd.integrations.kubernetes.scheduler import KubernetesScheduler

TOKEN = "s3cret"


@pytest.fixture
async def api() -> AsyncIterator[KubeApiServer]:
    async with KubeApiServer(tokens={TOKEN: "system:serviceaccount:watchd:watchd"}) as server:
        for i in range(1, 7):
            server.add_node(f"gpu-{i}", labels={"nvidia.com/gpu.product": "H100"})
        yield server


@pytest.fixture
async def k8s(api: KubeApiServer, tmp_path: Path) -> AsyncIterator[KubernetesScheduler]:
    path = api.write_kubeconfig(tmp_path, TOKEN)
    sched = KubernetesScheduler(make_client(path, in_cluster=False, timeout_s=2.0), eviction_deadline_s=0.5)
    yield sched
    await sched.aclose()


def taints(api: KubeApiServer, node: str) -> list[str]:
    return [t["key"] for t in api.node(node)["spec"].get("taints") or []]


async def test_owner_classes_on_kubernetes(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    assert (await k8s.drain({"gpu-1": "Xid 79 GPU 0000:3b:00.0"}))["gpu-1"].outcome == "drained"
    await k8s.wait_evictions()
    api.add_node(
        "gpu-7",
        labels={"nvidia.com/gpu.product": "H100"},
        unschedulable=True,
        taints=[
            {
                "key": "node.kubernetes.io/unschedulable",
                "effect": "NoSchedule",
                "timeAdded": "2026-01-02T00:00:00Z",
            }
        ],
    )
    api.add_node(
        "gpu-8",
        labels={"nvidia.com/gpu.product": "A100"},
        ready=False,
        taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}],
    )
    api.add_node("gpu-9", taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    [fleet] = fleet_backends(k8s)
    assert isinstance(fleet, KubernetesFleet)
    nodes = await fleet.fleet_nodes()
    listed = {u.node: u for u in unavailable_nodes(nodes, time.time())}
    assert {n: (u.owner, u.reason_class) for n, u in listed.items()} == {
        "gpu-1": ("watchd", "xid"),
        "gpu-7": ("admin", "admin"),
        "gpu-8": ("scheduler", "not_responding"),
    }  # gpu-9's permanent GPU taint is not a drain
    assert listed["gpu-1"].reason.startswith("watchd: Xid 79") and listed["gpu-1"].age_s is not None
    assert listed["gpu-7"].since == pytest.approx(1767312000.0)
    assert listed["gpu-8"].partitions == ("A100",)


async def test_spare_taint_never_on_a_busy_node(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    api.add_pod("train", "job-a-0", "gpu-2", owner=("Job", "job-a"), gpus=8)
    api.add_pod("kube-system", "dcgm-x", "gpu-3", owner=("DaemonSet", "dcgm"))  # a DaemonSet pod: idle
    [fleet] = fleet_backends(k8s)
    await fleet.set_spares("H100", ["gpu-3", "gpu-4"])
    assert SPARE_TAINT in taints(api, "gpu-3") and SPARE_TAINT in taints(api, "gpu-4")
    assert await fleet.spares() == {"H100": ["gpu-3", "gpu-4"]}
    with pytest.raises(SchedulerError, match="busy"):
        await fleet.set_spares("H100", ["gpu-2"])
    assert SPARE_TAINT not in taints(api, "gpu-2")
    await fleet.set_spares("H100", ["gpu-4"])  # gpu-3 released
    assert SPARE_TAINT not in taints(api, "gpu-3")
    await fleet.set_spares("H100", [])
    assert await fleet.spares() == {}
    spare_free = [n for n in await fleet.fleet_nodes() if n.spare]
    assert spare_free == []
