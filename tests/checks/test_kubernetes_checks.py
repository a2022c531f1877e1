"""Active checks on Kubernetes through the in-process API server (tests/harness/kube_api.py): a Job pinned to
each idle node (no GPU pod, not cordoned), the output from the pod's log, the time limit as the Job's
``activeDeadlineSeconds``, and validation of a cordoned node (the Job tolerates the taint; the node is
uncordoned only when every check passed). The test plays the kubelet with the recorded real outputs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.harness.kube_api import KubeApiServer
from watchd.checks.metrics import CheckMetrics
from watchd.checks.params import ChecksConfig
from watchd.checks.service import CheckService
from watchd.clock import SystemClock
from watchd.integrations.kubernetes.checks import KubernetesCheckRunner
from watchd.integrations.kubernetes.client import make_client
from watchd.integrations.kubernetes.scheduler import DRAIN_ANNOTATION, KubernetesScheduler
from watchd.model.events import Event
from watchd.store.database import Store

DATA = Path(__file__).resolve().parent.parent / "data" / "checks"
PASS = (DATA / "nccl" / "h100-8gpu-single-node-pass.txt").read_text()
TOKEN = "t0ken"


@pytest.fixture
async def api() -> AsyncIterator[KubeApiServer]:
    async with KubeApiServer(tokens={TOKEN: "system:serviceaccount:watchd:watchd"}) as server:
        for i in range(1, 5):
            server.add_node(f"gpu-{i}", labels={"nvidia.com/gpu.product": "H100"})
        yield server


@pytest.fixture
async def runner(api: KubeApiServer, tmp_path: Path) -> AsyncIterator[KubernetesCheckRunner]:
    path = api.write_kubeconfig(tmp_path, TOKEN)
    sched = KubernetesScheduler(make_client(path, in_cluster=False, timeout_s=2.0), eviction_deadline_s=1.0)
    yield KubernetesCheckRunner(sched, namespace="watchd", poll_interval_s=0.05, grace_s=1.0)
    await sched.aclose()


def service(runner: KubernetesCheckRunner, events: list[Event], **spec: object) -> CheckService:
    item = {
        "name": "nccl",
        "type": "nccl",
        "partitions": ["H100"],
        "max_share": 0.5,
        "time_limit": 30,
        **spec,
    }
    cfg = ChecksConfig.model_validate({"enabled": True, "runner": "kubernetes", "items": [item]})

    async def emit(event: Event) -> None:
        events.append(event)

    return CheckService(
        cfg, runner, Store.open(":memory:"), SystemClock(), emit, CheckMetrics(CollectorRegistry())
    )


async def kubelet(api: KubeApiServer, outputs: dict[str, tuple[str, int] | None], seen: set[str]) -> None:
    """Plays the kubelet: runs each new Job's pod, ends it with the node's recorded output (None: hangs)."""
    while True:
        for (ns, name), job in list(api.state.jobs.items()):
            if name in seen:
                continue
            seen.add(name)
            node = job["spec"]["template"]["spec"]["nodeName"]
            api.run_job(ns, name)
            out = outputs.get(node)
            if out is not None:
                api.finish_job(ns, name, *out)
        await asyncio.sleep(0.02)


async def test_a_round_of_jobs_pinned_to_idle_nodes(
    api: KubeApiServer, runner: KubernetesCheckRunner
) -> None:
    api.add_pod("train", "big-job-0", "gpu-3", gpus=8)  # a GPU pod: gpu-3 is busy
    api.add_pod("kube-system", "dcgm-exporter-x", "gpu-4", gpus=0)  # no GPUs asked: gpu-4 is idle
    low = PASS.replace("470.73", "312.00").replace("470.63", "311.00")
    outputs = {
        "gpu-1": (PASS, 0),
        "gpu-2": (low, 0),
        "gpu-4": ((DATA / "nccl" / "h100-cuda-failure.txt").read_text(), 1),
    }
    events: list[Event] = []
    seen: set[str] = set()
    task = asyncio.create_task(kubelet(api, outputs, seen))
    try:
        summary = await service(runner, events).run_round("nccl")
    finally:
        task.cancel()
    assert summary["checked"] == ["gpu-1", "gpu-2", "gpu-4"]
    assert summary["not_idle"] == {"gpu-3": "GPU pod train/big-job-0"}
    results = {e.node: e.attrs for e in events}
    assert results["gpu-1"]["outcome"] == "passed"
    assert results["gpu-2"]["evidence"] == "nccl busbw 312 GB/s < 80% of 450 GB/s"
    assert (
        results["gpu-4"]["evidence"]
        == "nccl test: Test CUDA failure common.cu:941 'system not yet initialized'"
    )
    job = runner.created[0]
    spec = job["spec"]["template"]["spec"]
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (0, 30)
    assert spec["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert spec["containers"][0]["command"][0] == "all_reduce_perf" and spec["restartPolicy"] == "Never"
    assert {j["spec"]["template"]["spec"]["nodeName"] for j in runner.created} == {"gpu-1", "gpu-2", "gpu-4"}
    assert [c for c in api.calls if c.resource == "jobs" and c.verb == "create" and c.status == 201]


async def test_a_hang_past_the_deadline_is_a_timeout(
    api: KubeApiServer, runner: KubernetesCheckRunner
) -> None:
    events: list[Event] = []
    seen: set[str] = set()
    task = asyncio.create_task(kubelet(api, {"gpu-1": None}, seen))
    try:
        svc = service(runner, events, time_limit=1, nodes=["gpu-1"], partitions=[])
        await svc.run_round("nccl")
    finally:
        task.cancel()
    assert events[0].attrs["outcome"] == "timeout"
    assert api.state.jobs == {} or all(j["status"].get("conditions") for j in api.state.jobs.values())


async def test_validation_of_a_cordoned_node(api: KubeApiServer, runner: KubernetesCheckRunner) -> None:
    await runner.scheduler.drain({"gpu-2": "nccl busbw 312 GB/s < 80% of 450 GB/s"})
    assert api.node("gpu-2")["spec"]["unschedulable"] is True
    await runner.scheduler.wait_evictions()  # the drain's evictions are over before anyone validates
    outputs: dict[str, tuple[str, int] | None] = {
        "gpu-2": (PASS.replace("470.73", "300.00").replace("470.63", "299"), 0)
    }
    events: list[Event] = []
    seen: set[str] = set()
    task = asyncio.create_task(kubelet(api, outputs, seen))
    try:
        svc = service(runner, events)
        v = await svc.validate("gpu-2", "validate:test")
        passed, _, done = v.passed, v.results, v.done
        assert (passed, done) == (False, "drained")
        record = json.loads(api.node("gpu-2")["metadata"]["annotations"][DRAIN_ANNOTATION])
        assert record["reason"] == "watchd: nccl 300GB/s (validate): nccl busbw 300 GB/s < 80% of 450 GB/s"
        assert api.node("gpu-2")["spec"]["unschedulable"] is True
        assert runner.created[-1]["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]
        outputs["gpu-2"] = (PASS, 0)
        v = await svc.validate("gpu-2", "validate:test2")
        passed, _, done = v.passed, v.results, v.done
        assert (passed, done) == (True, "resumed")
        assert not api.node("gpu-2")["spec"].get("unschedulable")
    finally:
        task.cancel()


async def test_the_harness_jobs_behave_as_the_api_server(
    api: KubeApiServer, runner: KubernetesCheckRunner
) -> None:
    """What the runner relies on: 201 and a pod on create, 409 on a second create, 422 without containers,
    the deadline enforced, the pods deleted with their Job."""
    import aiohttp

    url = f"{api.url}/apis/batch/v1/namespaces/watchd/jobs"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    job = {
        "metadata": {"name": "j1"},
        "spec": {
            "activeDeadlineSeconds": 1,
            "template": {"spec": {"nodeName": "gpu-1", "containers": [{"name": "c"}]}},
        },
    }
    async with aiohttp.ClientSession(headers=headers) as s:
        async with s.post(url, json=job) as r:
            assert r.status == 201
        async with s.post(url, json=job) as r:
            assert r.status == 409 and (await r.json())["reason"] == "AlreadyExists"
        async with s.post(url, json={"metadata": {"name": "j2"}, "spec": {"template": {"spec": {}}}}) as r:
            assert r.status == 422
        pods = [p for p in api.state.pods.values() if p["metadata"]["labels"].get("job-name") == "j1"]
        assert (
            len(pods) == 1
            and pods[0]["spec"]["nodeName"] == "gpu-1"
            and pods[0]["status"]["phase"] == "Pending"
        )
        api.run_job("watchd", "j1")
        await asyncio.sleep(1.1)
        async with s.get(f"{url}/j1") as r:
            body = await r.json()
        assert body["status"]["conditions"][0]["reason"] == "DeadlineExceeded"
        assert not [p for p in api.state.pods.values() if p["metadata"]["labels"].get("job-name") == "j1"]
        async with s.delete(f"{url}/j1") as r:
            assert r.status == 200
        async with s.get(f"{url}/j1") as r:
            assert r.status == 404


async def test_only_the_log_of_the_pod_the_job_controls_is_read(
    api: KubeApiServer, runner: KubernetesCheckRunner
) -> None:
    """A pod someone labelled with the Job's name (listed first) is not the Job's: its log, a pass, is not
    read; the Job's own pod's, a slow node's, is."""
    low = PASS.replace("470.73", "312.00").replace("470.63", "311.00")
    events: list[Event] = []
    seen: set[str] = set()

    async def kubelet_and_decoy() -> None:
        while True:
            for (ns, name), job in list(api.state.jobs.items()):
                if name in seen:
                    continue
                seen.add(name)
                node = job["spec"]["template"]["spec"]["nodeName"]
                api.add_pod(ns, f"{name}-decoy", node, labels={"job-name": name}, phase="Succeeded")
                decoy = (ns, f"{name}-decoy")
                api.state.pods = {decoy: api.state.pods.pop(decoy), **api.state.pods}  # listed first
                api.run_job(ns, name)
                api.finish_job(ns, name, low, 0)  # (the harness's Job controller knows pods by label)
                api.state.logs[decoy] = PASS
            await asyncio.sleep(0.02)

    task = asyncio.create_task(kubelet_and_decoy())
    try:
        await service(runner, events, nodes=["gpu-1"], partitions=[]).run_round("nccl")
    finally:
        task.cancel()
    assert events[0].attrs["evidence"] == "nccl busbw 312 GB/s < 80% of 450 GB/s"


async def test_a_pair_runs_as_one_job_per_node_and_rank_zero_is_the_run(
    api: KubeApiServer, runner: KubernetesCheckRunner
) -> None:
    from watchd.checks.runner import CheckJob

    runner.host_network = True
    job = CheckJob("fabric", "gpu-1", ("/opt/launch-nccl-pair",), 30, "fabric.gpu-1.abc123", peers=("gpu-2",))
    handle = await runner.submit(job)
    jobs = {name: j for (_, name), j in api.state.jobs.items()}
    assert sorted(jobs) == [handle.job_id, f"{handle.job_id}-r1"]
    for rank, node in enumerate(("gpu-1", "gpu-2")):
        spec = jobs[handle.job_id if rank == 0 else f"{handle.job_id}-r1"]["spec"]["template"]["spec"]
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        assert spec["nodeName"] == node and spec["hostNetwork"] is True
        assert env == {
            "WATCHD_RANK": str(rank),
            "WATCHD_WORLD_SIZE": "2",
            "WATCHD_NODES": "gpu-1,gpu-2",
            "WATCHD_MASTER_NODE": "gpu-1",
        }
    for name in jobs:
        api.run_job("watchd", name)
    two_nodes = (DATA / "nccl" / "h100-2node-16rank-wrong-columns.txt").read_text()
    api.finish_job("watchd", handle.job_id, two_nodes)
    out = await runner.wait(handle)
    assert out.status == "completed" and "338.82" in out.output
    assert list(api.state.jobs) == [("watchd", handle.job_id)]  # rank 1's Job ended with the run
    await runner.cancel(handle)
    assert api.state.jobs == {}


async def test_a_pair_that_cannot_start_whole_does_not_start(
    api: KubeApiServer, runner: KubernetesCheckRunner
) -> None:
    from watchd.checks.runner import CheckJob, RunnerError

    job = CheckJob("fabric", "gpu-1", ("x",), 30, "fabric.gpu-1.def456", peers=("gpu-2",))
    name = "watchd-check-fabric-def456"
    api.state.jobs[("watchd", f"{name}-r1")] = {"metadata": {"name": f"{name}-r1"}, "spec": {}, "status": {}}
    with pytest.raises(RunnerError, match="already exists"):
        await runner.submit(job)
    assert ("watchd", name) not in api.state.jobs  # rank 0's Job was deleted again


async def test_a_pair_round_on_kubernetes_drains_only_the_node_slow_with_every_partner(
    api: KubeApiServer, runner: KubernetesCheckRunner
) -> None:
    two_nodes = (DATA / "nccl" / "h100-2node-16rank-wrong-columns.txt").read_text()
    slow = two_nodes.replace("338.82", "41.20").replace("337.35", "40.90")
    # the kubelet ends each Job with its node's output: rank 0 prints the table, so gpu-3 leading is slow
    outputs = {"gpu-1": (two_nodes, 0), "gpu-2": (two_nodes, 0), "gpu-3": (slow, 0), "gpu-4": (two_nodes, 0)}
    events: list[Event] = []
    task = asyncio.create_task(kubelet(api, outputs, set()))
    try:
        summary = await service(runner, events, type="nccl-pair", name="fabric", max_share=1.0).run_round(
            "fabric"
        )
    finally:
        task.cancel()
    assert summary["failed"] == ["gpu-3"] and summary["runs"] == 4, summary
    results = {e.node: e.attrs for e in events}
    assert results["gpu-3"]["evidence"].startswith(
        "nccl 2-node busbw 41 GB/s with gpu-4 and busbw 41 GB/s with gpu-1"
    )
    assert sum(len(j["spec"]["template"]["spec"]["containers"][0]["env"]) == 4 for j in runner.created) == 8
