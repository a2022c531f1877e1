"""dcgm-exporter pages with Kubernetes pod labels (real pages of several versions, tests/data/dcgm-exporter):
the pod labels become the job label as the Kubernetes provider names jobs, encoder/decoder utilization is
read, and the engine's job topology places those GPUs in the job the provider lists."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from watchd.gpu.dcgm import parse_dcgm
from watchd.gpu.sampler import GpuSampler
from watchd.integrations.kubernetes.jobs import jobs_from_pods
from watchd.jobs.topology import JobTopology
from watchd.model.events import Event
from watchd.model.jobs import pod_job_label

DATA = Path(__file__).parent.parent / "data" / "dcgm-exporter"
T0 = 1_800_000_000.0


def _page(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    ("namespace", "pod", "label"),
    [
        ("train", "llama-worker-3", "k8s:train/llama"),  # Kubeflow PyTorchJob replica
        ("train", "llama-master-0", "k8s:train/llama"),
        ("batch", "resnet-x7k2p", "k8s:batch/resnet"),  # batch/v1 Job
        ("batch", "resnet-3-x7k2p", "k8s:batch/resnet"),  # Indexed Job
        ("ml", "big-workers-0-1-bq9zt", "k8s:ml/big-workers-0"),  # JobSet: its child Job (provider alias)
        ("", "dcgmproftester", "k8s:default/dcgmproftester"),  # a bare pod: its own name
    ],
)
def test_pod_job_label(namespace: str, pod: str, label: str) -> None:
    assert pod_job_label(namespace, pod) == label


def test_pod_job_label_without_a_pod() -> None:
    assert pod_job_label("default", "") is None


def test_t4_page_with_pod_labels() -> None:
    (s,) = parse_dcgm(_page("t4-pod-labels-gpu-operator-340.txt"), T0).samples
    assert s.gpu.model == "Tesla T4"
    assert s.job == "k8s:default/dcgmproftester"
    assert (s.util_enc, s.util_dec) == (0.0, 0.0)


def test_4x_page_mig_and_pods() -> None:
    by_uuid = parse_dcgm(_page("mixed-mig-pod-labels-dcgm-exporter-736.txt"), T0).by_uuid()
    ada = by_uuid["GPU-fc60126e-514d-3522-2828-c5daa8e99d85"]
    assert (ada.util_enc, ada.util_dec, ada.temp_c) == (9.0, 46.0, 44.0)
    assert ada.job is None  # no pod on it
    a30 = by_uuid["GPU-63bc0b91-2265-1b94-831c-15c41fe92675"]
    assert a30.gpu.mig_mode and a30.temp_c == 45.0
    # a Deployment's pods (<deployment>-<replicaset hash>-<suffix>): the ReplicaSet's name, one per GPU
    assert a30.job == "k8s:default/triton-server-f7cb5d77"
    assert by_uuid["GPU-9a63752e-af8d-fe52-7f0d-968bca6d52e3"].job == "k8s:default/triton-server-f7cb5d77"


def test_page_without_pods_has_no_job() -> None:
    (s,) = parse_dcgm(_page("no-pods-gpu-monitoring-tools-138.txt"), T0).samples
    assert s.job is None and s.util_gpu == 44.0 and s.power_w == pytest.approx(302.206)


class _Backend:
    name = "dcgm"


def test_summaries_carry_the_job_and_the_engine_places_the_gpu_in_it() -> None:
    events: list[Event] = []
    sampler = GpuSampler(_Backend(), "gpu-node-7", events.append, summary_window_s=5.0)  # type: ignore[arg-type]
    page = _page("t4-pod-labels-gpu-operator-340.txt")
    for t in range(12):
        sampler.observe(parse_dcgm(page, T0 + t).samples)
    summaries = [e for e in events if e.kind == "gpu_summary"]
    assert summaries and all(e.attrs.get("job") == "k8s:default/dcgmproftester" for e in summaries)

    # the Kubernetes provider lists the pod's Job; dcgm-exporter's label resolves to it
    pod = SimpleNamespace(
        metadata=SimpleNamespace(
            namespace="train", name="llama-worker-1", labels={"training.kubeflow.org/job-name": "llama"},
            ownerReferences=[SimpleNamespace(controller=True, kind="PyTorchJob", name="llama")], uid="u-1",
        ),
        spec=SimpleNamespace(nodeName="gpu-node-7"),
    )  # fmt: skip
    topology = JobTopology()
    topology.replace("kubernetes", jobs_from_pods([pod]))
    label = pod_job_label("train", "llama-worker-1")
    assert label is not None
    topology.observe_gpu("gpu-node-7", 0, label, T0)
    assert topology.job_of("gpu-node-7", 0, T0) == "k8s:train/llama"
    jobset_pod = SimpleNamespace(
        metadata=SimpleNamespace(
            namespace="ml", name="big-workers-0-1-bq9zt", labels={"jobset.sigs.k8s.io/jobset-name": "big"},
            ownerReferences=[], uid="u-2",
        ),
        spec=SimpleNamespace(nodeName="gpu-node-8"),
    )  # fmt: skip
    topology.replace("kubernetes", jobs_from_pods([pod, jobset_pod]))
    child = pod_job_label("ml", "big-workers-0-1-bq9zt")
    assert child == "k8s:ml/big-workers-0"
    assert topology.provided(child) is not None and topology.provided(child).id == "k8s:ml/big"  # type: ignore[union-attr]
