"""The Kubernetes adapter through the real client (lightkube) against the in-process API server."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.harness.kube_api import KubeApiServer
from watchd.integrations.base import SchedulerError
from watchd.integrations.kubernetes.client import make_client
from watchd.integrations.kubernetes.jobs import KubernetesJobProvider
from watchd.integrations.kubernetes.scheduler import (
    DRAIN_ANNOTATION,
    EVICTION_ANNOTATION,
    FOREIGN_CORDON,
    KubernetesScheduler,
    taint_value,
)
from watchd.jobs.model import JobProviderError

TOKEN = "s3cret"
TAINT = "watchd.io/gpu-fault"


@pytest.fixture
async def api() -> AsyncIterator[KubeApiServer]:
    async with KubeApiServer(tokens={TOKEN: "system:serviceaccount:watchd:watchd"}) as server:
        for i in range(1, 5):
            server.add_node(f"gpu-{i}", labels={"nvidia.com/gpu.product": "H100" if i < 4 else "A100"})
        yield server


def kubeconfig(api: KubeApiServer, tmp_path: Path, token: str = TOKEN) -> Path:
    return api.write_kubeconfig(tmp_path, token)


@pytest.fixture
async def k8s(api: KubeApiServer, tmp_path: Path) -> AsyncIterator[KubernetesScheduler]:
    sched = KubernetesScheduler(
        make_client(kubeconfig(api, tmp_path), in_cluster=False, timeout_s=2.0),
        eviction_deadline_s=1.0,
        eviction_backoff_s=(0.05, 0.2),
    )
    yield sched
    await sched.aclose()


def drain_record(api: KubeApiServer, node: str) -> dict[str, object] | None:
    text = api.node(node)["metadata"].get("annotations", {}).get(DRAIN_ANNOTATION)
    return json.loads(text) if text else None


def node_taints(api: KubeApiServer, node: str) -> list[dict[str, str]]:
    return list(api.node(node)["spec"].get("taints") or [])


async def test_states_and_pools(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    api.add_node("gpu-5", unschedulable=True, ready=False)
    states = await k8s.node_states(["gpu-1", "gpu-5", "nope"])
    assert set(states) == {"gpu-1", "gpu-5"}
    assert not states["gpu-1"].drained and states["gpu-1"].state == "ready"
    assert states["gpu-5"].drained and states["gpu-5"].reason == FOREIGN_CORDON
    assert states["gpu-5"].state == "notready" and not states["gpu-5"].down
    assert await k8s.pools() == {"H100": ["gpu-1", "gpu-2", "gpu-3"], "A100": ["gpu-4"], "default": ["gpu-5"]}


async def test_drain_cordons_taints_and_records(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    api.add_pod(
        "ml", "train-0", "gpu-1", labels={"batch.kubernetes.io/job-name": "train"}, owner=("Job", "train")
    )
    api.add_pod("kube-system", "dcgm-exporter-x", "gpu-1", owner=("DaemonSet", "dcgm-exporter"))
    api.add_pod("kube-system", "kube-proxy-gpu-1", "gpu-1", annotations={"kubernetes.io/config.mirror": "x"})
    api.add_pod("ml", "done", "gpu-1", phase="Succeeded")
    results = await k8s.drain({"gpu-1": "Xid 79: GPU has fallen off the bus (GPU 3)"})
    assert results["gpu-1"].outcome == "drained"
    assert results["gpu-1"].detail == "watchd: Xid 79: GPU has fallen off the bus (GPU 3)"
    node = api.node("gpu-1")
    assert node["spec"]["unschedulable"] is True
    assert node_taints(api, "gpu-1") == [
        {"key": TAINT, "value": "Xid-79-GPU-has-fallen-off-the-bus-GPU-3", "effect": "NoSchedule"}
    ]
    record = drain_record(api, "gpu-1")
    assert record is not None and record["cordoned"] is True and record["tainted"] is True
    # exactly one write to the node for the cordon, with a merge patch carrying the resourceVersion
    node_writes = [c for c in api.writes("nodes")]
    assert [c.content_type for c in node_writes] == ["application/merge-patch+json"]
    reports = await k8s.wait_evictions()
    assert reports["gpu-1"].evicted == ["ml/train-0"]
    assert set(reports["gpu-1"].skipped) == {
        "kube-system/dcgm-exporter-x",
        "kube-system/kube-proxy-gpu-1",
        "ml/done",
    }
    assert ("kube-system", "dcgm-exporter-x") in api.state.pods  # DaemonSet pod left alone
    assert json.loads(api.node("gpu-1")["metadata"]["annotations"][EVICTION_ANNOTATION])["evicted"] == 1
    # twice: nothing more is written
    writes = len(api.writes("nodes"))
    again = await k8s.drain({"gpu-1": "Xid 79 again"})
    assert again["gpu-1"].outcome == "already_drained"
    assert len(api.writes("nodes")) == writes


async def test_pdb_blocks_eviction_until_the_deadline(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    api.add_pod("ml", "web-0", "gpu-2", labels={"app": "web"}, owner=("ReplicaSet", "web"))
    api.add_pod("ml", "web-1", "gpu-3", labels={"app": "web"}, owner=("ReplicaSet", "web"))
    api.add_pdb("ml", "web", {"app": "web"}, min_available=2)
    start = time.monotonic()
    assert (await k8s.drain({"gpu-2": "Xid 48"}))["gpu-2"].outcome == "drained"
    cordoned_after = time.monotonic() - start
    report = (await k8s.wait_evictions())["gpu-2"]
    assert cordoned_after < 0.5  # the budget does not hold up the cordon
    assert report.blocked == ["ml/web-0"] and not report.evicted
    attempts = [c for c in api.calls if c.resource == "pods/eviction"]
    assert len(attempts) >= 4 and {c.status for c in attempts} == {429}  # retried with backoff
    assert 0.8 <= report.seconds <= 1.5  # up to the deadline (1 s), no further
    assert ("ml", "web-0") in api.state.pods


async def test_pdb_relaxed_while_retrying(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    import asyncio

    api.add_pod("ml", "web-0", "gpu-2", labels={"app": "web"})
    api.add_pdb("ml", "web", {"app": "web"}, min_available=1)
    k8s.eviction_deadline_s = 5.0
    await k8s.drain({"gpu-2": "Xid 48"})
    await asyncio.sleep(0.3)
    api.add_pod("ml", "web-1", "gpu-3", labels={"app": "web"})  # the replacement is running elsewhere
    report = (await k8s.wait_evictions())["gpu-2"]
    assert report.evicted == ["ml/web-0"] and not report.blocked
    assert report.seconds < 2.0


async def test_delete_after_deadline_and_gpu_only(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    api.add_pod("ml", "train-0", "gpu-2", labels={"app": "t"}, gpus=8)
    api.add_pod("ml", "sidecar", "gpu-2", labels={"app": "s"})
    api.add_pdb("ml", "t", {"app": "t"}, min_available=1)
    k8s.gpu_only, k8s.delete_after_deadline, k8s.eviction_deadline_s = True, True, 0.3
    await k8s.drain({"gpu-2": "Xid 48"})
    report = (await k8s.wait_evictions())["gpu-2"]
    assert report.blocked == ["ml/train-0"] and report.deleted == ["ml/train-0"]
    assert report.skipped == {"ml/sidecar": "requests no nvidia.com/gpu"}
    assert ("ml", "train-0") not in api.state.pods and ("ml", "sidecar") in api.state.pods


async def test_never_touches_or_uncordons_someone_elses_node(
    api: KubeApiServer, k8s: KubernetesScheduler
) -> None:
    api.add_node("gpu-9", unschedulable=True, taints=[{"key": "maint", "effect": "NoSchedule"}])
    before = json.dumps(api.node("gpu-9"))
    result = (await k8s.drain({"gpu-9": "Xid 79"}))["gpu-9"]
    assert result.outcome == "skipped" and "not set by watchd" in result.detail
    resumed = await k8s.resume("gpu-9")
    assert resumed.outcome == "refused"
    assert json.dumps(api.node("gpu-9")) == before
    assert not api.writes("nodes")


async def test_resume_undoes_only_what_watchd_did(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    # our taint key is already on the node (someone put it there): watchd cordons, does not own the taint
    api.node("gpu-3")["spec"]["taints"] = [
        {"key": TAINT, "value": "manual", "effect": "NoSchedule"},
        {"key": "other", "effect": "NoSchedule"},
    ]
    await k8s.drain({"gpu-3": "Xid 64"})
    record = drain_record(api, "gpu-3")
    assert record is not None and record["cordoned"] is True and record["tainted"] is False
    assert (await k8s.resume("gpu-3")).outcome == "resumed"
    node = api.node("gpu-3")
    assert "unschedulable" not in node["spec"]
    assert node_taints(api, "gpu-3") == [
        {"key": TAINT, "value": "manual", "effect": "NoSchedule"},
        {"key": "other", "effect": "NoSchedule"},
    ]
    assert DRAIN_ANNOTATION not in node["metadata"]["annotations"]
    # an admin uncordoned it meanwhile: nothing to resume
    await k8s.drain({"gpu-4": "Xid 64"})
    api.node("gpu-4")["spec"]["unschedulable"] = False
    assert (await k8s.resume("gpu-4")).outcome == "not_drained"
    assert (await k8s.resume("nope")).outcome == "failed"


async def test_conflict_is_read_again_and_decided_again(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    states = await k8s.node_states(["gpu-1", "gpu-2"])
    # someone writes both nodes after watchd read them: gpu-1 gets a label, gpu-2 gets cordoned by an admin
    api.node("gpu-1")["metadata"]["labels"]["x"] = "y"
    api.state.bump(api.node("gpu-1"))
    api.node("gpu-2")["spec"]["unschedulable"] = True
    api.state.bump(api.node("gpu-2"))
    results = await k8s.drain({"gpu-1": "Xid 79", "gpu-2": "Xid 79"}, states)
    assert results["gpu-1"].outcome == "drained"
    assert api.node("gpu-1")["metadata"]["labels"]["x"] == "y"  # the other writer's change survived
    assert results["gpu-2"].outcome == "skipped"  # the admin's cordon won: never touched
    assert drain_record(api, "gpu-2") is None
    assert [c.status for c in api.calls if c.verb == "patch" and c.path.endswith("gpu-1")][:2] == [409, 200]


async def test_api_errors_surface_in_the_outcome(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    api.deny.add(("*", "patch", "nodes"))
    result = (await k8s.drain({"gpu-1": "Xid 79"}))["gpu-1"]
    assert result.outcome == "failed" and "PATCH nodes/gpu-1: 403 Forbidden" in result.detail
    api.deny.clear()
    api.inject(500, method="PATCH", path="/nodes/gpu-1", message="etcdserver: request timed out")
    result = (await k8s.drain({"gpu-1": "Xid 79"}))["gpu-1"]
    assert result.outcome == "failed" and "500 InternalError: etcdserver: request timed out" in result.detail
    api.inject(0, method="PATCH", path="/nodes/gpu-1", delay=3.0)  # longer than the client's 2 s timeout
    result = (await k8s.drain({"gpu-1": "Xid 79"}))["gpu-1"]
    assert result.outcome == "failed" and "timed out" in result.detail
    api.inject(503, method="GET", path="/nodes/gpu-2")
    with pytest.raises(SchedulerError, match="GET nodes/gpu-2: 503"):
        await k8s.node_states(["gpu-2"])
    api.inject(403, method="GET", path="/api/v1/pods")
    with pytest.raises(SchedulerError, match="LIST pods"):
        await k8s.requeue_jobs_on("gpu-1")


async def test_unauthorized(api: KubeApiServer, tmp_path: Path) -> None:
    sched = KubernetesScheduler(make_client(kubeconfig(api, tmp_path, token="wrong"), in_cluster=False))
    try:
        with pytest.raises(SchedulerError, match="401 Unauthorized"):
            await sched.pools()
    finally:
        await sched.aclose()


def _job_pods(api: KubeApiServer) -> None:
    # a batch Job over two nodes, a JobSet, a PyTorchJob, a Deployment pod and a bare pod
    for i, node in enumerate(["gpu-1", "gpu-2"]):
        api.add_pod(
            "ml", f"bert-{i}", node, labels={"batch.kubernetes.io/job-name": "bert"}, owner=("Job", "bert")
        )
    api.add_pod(
        "ml",
        "llm-w-0-0",
        "gpu-1",
        owner=("Job", "llm-w-0"),
        labels={"jobset.sigs.k8s.io/jobset-name": "llm", "batch.kubernetes.io/job-name": "llm-w-0"},
    )
    api.add_pod(
        "ml",
        "llm-w-0-1",
        "gpu-3",
        owner=("Job", "llm-w-0"),
        labels={"jobset.sigs.k8s.io/jobset-name": "llm", "batch.kubernetes.io/job-name": "llm-w-0"},
    )
    api.add_pod(
        "research",
        "gpt-master-0",
        "gpu-1",
        owner=("PyTorchJob", "gpt"),
        labels={"training.kubeflow.org/job-name": "gpt", "training.kubeflow.org/replica-type": "master"},
    )
    api.add_pod(
        "research",
        "gpt-worker-0",
        "gpu-4",
        owner=("PyTorchJob", "gpt"),
        labels={"training.kubeflow.org/job-name": "gpt", "training.kubeflow.org/replica-type": "worker"},
    )
    api.add_pod("ml", "api-7d9f-x", "gpu-1", owner=("ReplicaSet", "api-7d9f"))
    api.add_pod("ml", "scratch", "gpu-1")
    api.add_pod("kube-system", "nvidia-device-plugin-x", "gpu-1", owner=("DaemonSet", "nvidia-device-plugin"))
    api.add_pod(
        "ml", "unrelated", "gpu-2", labels={"batch.kubernetes.io/job-name": "other"}, owner=("Job", "other")
    )


async def test_requeue_deletes_every_pod_of_each_job(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    _job_pods(api)
    result = await k8s.requeue_jobs_on("gpu-1")
    assert sorted(result.requeued) == ["ml/bert", "ml/llm", "research/gpt"]
    assert sorted(result.not_requeueable) == ["ml/api-7d9f-x", "ml/scratch"]
    assert result.ok
    left = sorted(name for _, name in api.state.pods)
    # the jobs' pods on other nodes went too (their controllers restart the whole job); the rest stayed
    assert left == ["api-7d9f-x", "nvidia-device-plugin-x", "scratch", "unrelated"]
    again = await k8s.requeue_jobs_on("gpu-1")
    assert again.requeued == () and not api.writes("nodes")


async def test_requeue_of_one_job_leaves_the_others(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    _job_pods(api)
    result = await k8s.requeue_jobs_on("gpu-1", "k8s:ml/llm")  # the job as a finding names it
    assert result.requeued == ("ml/llm",) and result.not_requeueable == ()
    left = {name for _, name in api.state.pods}
    assert not any(n.startswith("llm") for n in left) and any(n.startswith("bert") for n in left)
    assert (await k8s.requeue_jobs_on("gpu-1", "research/gpt")).requeued == ("research/gpt",)


async def test_requeue_annotate_only(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    _job_pods(api)
    k8s.requeue_mode = "annotate"
    result = await k8s.requeue_jobs_on("gpu-2")
    assert sorted(result.requeued) == ["ml/bert", "ml/other"]
    assert len(api.state.pods) == 10  # nothing deleted
    note = json.loads(
        api.state.pods[("ml", "bert-0")]["metadata"]["annotations"]["watchd.io/requeue-requested"]
    )
    assert note["node"] == "gpu-2"


async def test_requeue_failure_is_reported_per_job(api: KubeApiServer, k8s: KubernetesScheduler) -> None:
    _job_pods(api)
    api.inject(403, method="DELETE", path="/namespaces/research/pods/", times=5)
    result = await k8s.requeue_jobs_on("gpu-1")
    assert set(result.failed) == {"research/gpt"} and "403 Forbidden" in result.failed["research/gpt"]
    assert sorted(result.requeued) == ["ml/bert", "ml/llm"]


async def test_job_provider(api: KubeApiServer, tmp_path: Path) -> None:
    _job_pods(api)
    api.add_pod(
        "ml", "bert-pending", "gpu-4", labels={"batch.kubernetes.io/job-name": "bert"}, phase="Pending"
    )
    client = make_client(kubeconfig(api, tmp_path), in_cluster=False)
    provider = KubernetesJobProvider(client)
    try:
        jobs = {j.id: j for j in await provider.running_jobs()}
        assert set(jobs) == {"k8s:ml/bert", "k8s:ml/llm", "k8s:research/gpt", "k8s:ml/other"}
        bert = jobs["k8s:ml/bert"]
        assert bert.nodes == ("gpu-1", "gpu-2")  # the pending pod is not running anywhere yet
        # the agents label GPUs with the pod uid: each running pod of the job is an alias
        # each pod's UID and its name as dcgm-exporter's pod labels give it (issue 20)
        assert len(bert.aliases) == 4 and all(a.startswith("k8s:") for a in bert.aliases)
        assert jobs["k8s:ml/llm"].nodes == ("gpu-1", "gpu-3") and jobs["k8s:ml/llm"].name == "JobSet/llm"
        gpt = jobs["k8s:research/gpt"]
        assert gpt.name == "PyTorchJob/gpt" and gpt.source == "kubernetes"
        assert [c.path for c in api.calls][-1] == "/api/v1/pods"
        api.inject(500, path="/api/v1/pods")
        with pytest.raises(JobProviderError, match="500"):
            await provider.running_jobs()
    finally:
        await client.close()


def test_taint_value_is_a_valid_label_value() -> None:
    assert taint_value("watchd: Xid 79 (GPU 0000:3b:00.0) fell off") == "Xid-79-GPU-0000-3b-00.0-fell-off"
    long = taint_value("watchd: " + "x" * 100 + " !")
    assert len(long) == 63
    assert taint_value("watchd: !!!") == ""


async def test_privileges_are_asked_of_rbac_and_change_nothing(
    api: KubeApiServer, k8s: KubernetesScheduler
) -> None:
    allowed = await k8s.privileges()
    assert allowed.allowed is True, allowed
    api.deny.add(("system:serviceaccount:watchd:watchd", "create", "pods/eviction"))
    refused = await k8s.privileges()
    assert refused.allowed is False and "create pods/eviction" in refused.detail, refused
    assert "patch nodes" not in refused.detail
    # the reviews are the only requests that create anything, and the API server keeps none of them
    assert {c.resource for c in api.writes()} == {"selfsubjectaccessreviews"}
    api.inject(503, method="POST", path="selfsubjectaccessreviews")
    unknown = await k8s.privileges()
    assert unknown.allowed is None and "could not ask" in unknown.detail, unknown


async def test_reboot_asks_the_sites_daemon_once_and_ends_with_a_new_boot(
    api: KubeApiServer, k8s: KubernetesScheduler
) -> None:
    assert (await k8s.reboot("gpu-1", "reboot after Xid 79")).outcome == "not_drained"  # in service
    await k8s.drain({"gpu-1": "Xid 79"})
    before = (await k8s.node_states(["gpu-1"]))["gpu-1"]
    assert before.boot_id is not None and not before.reboot_pending
    result = await k8s.reboot("gpu-1", "reboot after Xid 79")
    assert result.outcome == "rebooting"
    asked = json.loads(api.node("gpu-1")["metadata"]["annotations"]["watchd.io/reboot-requested"])
    assert asked["boot_id"] == before.boot_id and asked["reason"] == "watchd: reboot after Xid 79"
    assert (await k8s.node_states(["gpu-1"]))["gpu-1"].reboot_pending
    assert (await k8s.reboot("gpu-1", "again")).detail == "a reboot is pending already"
    api.node("gpu-1")["status"]["nodeInfo"]["bootID"] = "a-new-boot"  # the kubelet after the reboot
    api.state.bump(api.node("gpu-1"))
    after = (await k8s.node_states(["gpu-1"]))["gpu-1"]
    assert after.boot_id == "a-new-boot" and not after.reboot_pending and after.drained  # still cordoned
    api.add_node("adm", unschedulable=True)
    assert (await k8s.reboot("adm", "x")).outcome == "refused"  # someone else's cordon
