"""JobTopology: provider snapshots merged with the agents' per-GPU job labels (TTL, aliases, fallbacks)."""

from __future__ import annotations

from watchd.jobs.model import JobInfo
from watchd.jobs.topology import JobTopology

POD_A = "k8s:0f6c1a2e-7d0b-4c55-9d7e-1a2b3c4d5e6f"
POD_B = "k8s:9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


def slurm_job(job_id: str, *nodes: str, partition: str | None = "gpu") -> JobInfo:
    return JobInfo(id=job_id, nodes=tuple(nodes), source="slurm", partition=partition)


def label(topo: JobTopology, node: str, gpus: range | list[int], job: str | None, now: float) -> None:
    for gpu in gpus:
        topo.observe_gpu(node, gpu, job, now)


# --------------------------------------------------------------------------- provider snapshots


def test_provider_snapshot_lists_jobs_with_their_nodes_and_metadata() -> None:
    topo = JobTopology()
    job = JobInfo(
        "slurm:1", ("n1", "n2"), "slurm", partition="gpu", start_time=1000.0, ranks={"n1": 0, "n2": 8}
    )
    topo.replace("slurm", [job])
    label(topo, "n1", range(2), "slurm:1", 100.0)
    label(topo, "n2", range(2), "slurm:1", 100.0)
    view = topo.jobs(100.0)["slurm:1"]
    assert view.nodes == ("n1", "n2")
    assert view.gpus == {"n1": (0, 1), "n2": (0, 1)}
    assert (view.partition, view.source, view.start_time) == ("gpu", "slurm", 1000.0)
    assert dict(view.ranks) == {"n1": 0, "n2": 8}


def test_finished_job_disappears_at_the_next_snapshot() -> None:
    topo = JobTopology()
    topo.replace("slurm", [slurm_job("slurm:1", "n1"), slurm_job("slurm:2", "n2")])
    assert set(topo.jobs(0.0)) == {"slurm:1", "slurm:2"}
    topo.replace("slurm", [slurm_job("slurm:2", "n2")])
    assert set(topo.jobs(0.0)) == {"slurm:2"}
    assert topo.provided("slurm:1") is None


def test_shrunk_job_loses_the_dropped_node_even_while_its_gpus_still_carry_the_label() -> None:
    topo = JobTopology(member_ttl_s=60.0)
    topo.replace("slurm", [slurm_job("slurm:1", "n1", "n2", "n3")])
    for node in ("n1", "n2", "n3"):
        label(topo, node, range(4), "slurm:1", 100.0)
    topo.replace("slurm", [slurm_job("slurm:1", "n1", "n2")])
    view = topo.jobs(105.0)["slurm:1"]
    assert view.nodes == ("n1", "n2")
    assert set(view.gpus) == {"n1", "n2"}


def test_requeued_job_moves_to_its_new_nodes() -> None:
    topo = JobTopology()
    topo.replace("slurm", [slurm_job("slurm:7", "n1", "n2")])
    label(topo, "n1", range(8), "slurm:7", 10.0)
    label(topo, "n2", range(8), "slurm:7", 10.0)
    topo.replace("slurm", [slurm_job("slurm:7", "n5", "n6")])
    label(topo, "n5", range(8), "slurm:7", 20.0)
    view = topo.jobs(20.0)["slurm:7"]
    assert view.nodes == ("n5", "n6")
    assert view.gpus["n5"] == tuple(range(8))
    assert view.gpus["n6"] == ()  # not reported yet: no GPUs known there
    assert "n1" not in view.gpus and "n2" not in view.gpus


def test_snapshots_of_two_providers_are_independent() -> None:
    topo = JobTopology()
    topo.replace("slurm", [slurm_job("slurm:1", "n1")])
    topo.replace("kubernetes", [JobInfo("k8s:ml/train", ("k1",), "kubernetes")])
    topo.replace("slurm", [])  # slurm's answer replaces only slurm's jobs
    jobs = topo.jobs(0.0)
    assert set(jobs) == {"k8s:ml/train"}
    assert jobs["k8s:ml/train"].source == "kubernetes"


# --------------------------------------------------------------------------- aliases


def test_pod_uid_labels_map_to_the_owning_job() -> None:
    topo = JobTopology()
    job = JobInfo("k8s:ml/train", ("k1", "k2"), "kubernetes", aliases=(POD_A, POD_B))
    topo.replace("kubernetes", [job])
    label(topo, "k1", range(4), POD_A, 50.0)
    label(topo, "k2", range(4), POD_B, 50.0)
    jobs = topo.jobs(50.0)
    assert set(jobs) == {"k8s:ml/train"}  # no agent-only job per pod
    assert jobs["k8s:ml/train"].gpus == {"k1": (0, 1, 2, 3), "k2": (0, 1, 2, 3)}
    assert topo.canonical(POD_A) == "k8s:ml/train"
    assert topo.job_of("k2", 3, 50.0) == "k8s:ml/train"
    provided = topo.provided(POD_B)
    assert provided is not None and provided.id == "k8s:ml/train"
    assert topo.take_unknown() == set()


def test_aliases_are_dropped_with_the_job() -> None:
    topo = JobTopology()
    topo.replace("kubernetes", [JobInfo("k8s:ml/train", ("k1",), "kubernetes", aliases=(POD_A,))])
    topo.replace("kubernetes", [])
    assert topo.canonical(POD_A) == POD_A
    assert topo.provided(POD_A) is None


# --------------------------------------------------------------------------- agent labels and TTL


def test_gpu_whose_label_stops_being_reported_leaves_the_job_after_the_ttl() -> None:
    topo = JobTopology(member_ttl_s=60.0)
    topo.replace("slurm", [slurm_job("slurm:1", "n1"), slurm_job("slurm:2", "n1")])  # two jobs: no fallback
    label(topo, "n1", range(4), "slurm:1", 0.0)
    for t in range(10, 101, 10):  # GPUs 0-2 keep reporting, GPU 3 fell silent at t=0
        label(topo, "n1", range(3), "slurm:1", float(t))
    assert topo.jobs(60.0)["slurm:1"].gpus["n1"] == (0, 1, 2, 3)  # exactly at the TTL: still a member
    assert topo.job_of("n1", 3, 60.0) == "slurm:1"
    assert topo.jobs(60.5)["slurm:1"].gpus["n1"] == (0, 1, 2)
    assert topo.job_of("n1", 3, 60.5) is None
    assert topo.job_of("n1", 0, 100.0) == "slurm:1"


def test_gpu_reporting_no_job_leaves_it_at_once() -> None:
    topo = JobTopology()
    topo.replace("slurm", [slurm_job("slurm:1", "n1"), slurm_job("slurm:2", "n1")])
    label(topo, "n1", range(2), "slurm:1", 0.0)
    topo.observe_gpu("n1", 1, None, 5.0)
    assert topo.jobs(5.0)["slurm:1"].gpus["n1"] == (0,)
    assert topo.job_of("n1", 1, 5.0) is None


def test_gpu_switching_job_belongs_only_to_the_new_one() -> None:
    topo = JobTopology()
    topo.replace("slurm", [slurm_job("slurm:1", "n1"), slurm_job("slurm:2", "n1")])
    label(topo, "n1", range(4), "slurm:1", 0.0)
    topo.observe_gpu("n1", 2, "slurm:2", 10.0)
    jobs = topo.jobs(10.0)
    assert jobs["slurm:1"].gpus["n1"] == (0, 1, 3)
    assert jobs["slurm:2"].gpus["n1"] == (2,)
    assert topo.job_of("n1", 2, 10.0) == "slurm:2"


def test_agent_only_job_is_known_from_the_labels() -> None:
    topo = JobTopology(member_ttl_s=30.0)  # no provider configured
    label(topo, "n2", [1, 0], "slurm:9", 0.0)
    label(topo, "n1", [3], "slurm:9", 0.0)
    view = topo.jobs(10.0)["slurm:9"]
    assert view.source == "agent"
    assert view.nodes == ("n1", "n2")
    assert view.gpus == {"n1": (3,), "n2": (0, 1)}
    assert view.partition is None
    assert topo.jobs(31.0) == {}  # every label expired: the job is gone


def test_unlabelled_gpus_of_the_only_provider_job_on_a_node_belong_to_it() -> None:
    topo = JobTopology()
    topo.replace("slurm", [slurm_job("slurm:1", "n1", "n2"), slurm_job("slurm:2", "n2")])
    label(topo, "n1", range(4), None, 10.0)  # no process mapping on these agents
    label(topo, "n2", range(4), None, 10.0)
    jobs = topo.jobs(10.0)
    assert jobs["slurm:1"].gpus["n1"] == (0, 1, 2, 3)  # n1 runs only slurm:1
    assert jobs["slurm:1"].gpus["n2"] == ()  # n2 runs two jobs: which GPUs is unknown
    assert jobs["slurm:2"].gpus["n2"] == ()


def test_unlabelled_fallback_skips_gpus_labelled_otherwise_and_expires() -> None:
    topo = JobTopology(member_ttl_s=60.0)
    topo.replace("slurm", [slurm_job("slurm:1", "n1")])
    label(topo, "n1", range(4), None, 0.0)
    topo.observe_gpu("n1", 3, "slurm:55", 0.0)  # a job the provider does not list on n1
    jobs = topo.jobs(0.0)
    assert jobs["slurm:1"].gpus["n1"] == (0, 1, 2)
    assert jobs["slurm:55"].gpus == {"n1": (3,)}
    assert topo.jobs(61.0)["slurm:1"].gpus["n1"] == ()  # the unlabelled sightings are stale too


def test_labelled_gpus_win_over_the_unlabelled_fallback() -> None:
    topo = JobTopology()
    topo.replace("slurm", [slurm_job("slurm:1", "n1")])
    label(topo, "n1", [0, 1], "slurm:1", 0.0)
    label(topo, "n1", [2, 3], None, 0.0)  # idle GPUs of a node whose job uses only two
    assert topo.jobs(0.0)["slurm:1"].gpus["n1"] == (0, 1)


# --------------------------------------------------------------------------- unknown labels, prune


def test_take_unknown_returns_labels_no_provider_lists_once() -> None:
    topo = JobTopology()
    topo.observe_gpu("n1", 0, "slurm:5", 0.0)
    assert topo.take_unknown() == set()  # no provider at all: nothing to refresh
    topo.replace("slurm", [slurm_job("slurm:1", "n1")])
    topo.observe_gpu("n1", 0, "slurm:1", 1.0)
    topo.observe_gpu("n1", 1, "slurm:5", 1.0)
    topo.observe_gpu("n2", 0, "slurm:6", 1.0)
    topo.observe_gpu("n2", 1, None, 1.0)
    assert topo.take_unknown() == {"slurm:5", "slurm:6"}
    assert topo.take_unknown() == set()  # taken: cleared


def test_a_new_snapshot_clears_the_unknown_labels() -> None:
    topo = JobTopology()
    topo.replace("slurm", [])
    topo.observe_gpu("n1", 0, "slurm:5", 0.0)
    topo.replace("slurm", [slurm_job("slurm:5", "n1")])
    assert topo.take_unknown() == set()


def test_prune_forgets_stale_observations_and_nodes() -> None:
    topo = JobTopology(member_ttl_s=60.0)
    for i in range(100):  # nodes that come and go
        label(topo, f"old-{i}", range(8), f"slurm:{i}", 0.0)
    label(topo, "n1", range(8), "slurm:1000", 100.0)
    topo.prune(100.0)
    assert set(topo._node_gpus) == {"n1"}
    assert {node for node, _ in topo._seen} == {"n1"}
    assert len(topo._seen) == 8
    assert set(topo.jobs(100.0)) == {"slurm:1000"}
    topo.prune(1000.0)
    assert topo._seen == {} and topo._node_gpus == {}


def test_prune_keeps_observations_within_the_ttl() -> None:
    topo = JobTopology(member_ttl_s=60.0)
    label(topo, "n1", range(2), "slurm:1", 40.0)
    topo.prune(100.0)  # 60 s old: exactly the TTL, still a member
    assert topo.job_of("n1", 0, 100.0) == "slurm:1"


def test_forget_node_drops_its_gpus() -> None:
    topo = JobTopology()
    label(topo, "n1", range(2), "slurm:1", 0.0)
    label(topo, "n2", range(2), "slurm:1", 0.0)
    topo.forget_node("n1")
    assert topo.jobs(0.0)["slurm:1"].nodes == ("n2",)


# --------------------------------------------------------------------------- heartbeats


def test_heartbeats_place_a_job_the_agents_cannot_map() -> None:
    topo = JobTopology(member_ttl_s=30.0)
    label(topo, "n1", range(4), None, 0.0)  # summaries: no process mapping (a container without /proc)
    label(topo, "n2", range(4), None, 0.0)
    topo.observe_rank("n1", "train-7", 2, 1.0)
    topo.observe_rank("n1", "train-7", 3, 1.0)
    topo.observe_rank("n2", "train-7", None, 1.0)  # a rank that did not say its GPU
    view = topo.jobs(10.0)["train-7"]
    assert view.source == "agent"
    assert view.nodes == ("n1", "n2")
    assert view.gpus == {"n1": (2, 3), "n2": (0, 1, 2, 3)}  # n2 runs only this job: its unlabelled GPUs
    label(topo, "n1", [2], None, 12.0)  # a later summary saying "no job" does not take the rank's GPU away
    assert topo.jobs(12.0)["train-7"].gpus["n1"] == (2, 3)
    assert "train-7" not in topo.jobs(31.5)  # the ranks stopped reporting: the job is gone


def test_a_rank_without_gpu_on_a_shared_node_names_no_gpus() -> None:
    topo = JobTopology()
    label(topo, "n1", range(4), None, 0.0)
    topo.observe_rank("n1", "a", None, 0.0)
    topo.observe_rank("n1", "b", None, 0.0)
    jobs = topo.jobs(1.0)
    assert jobs["a"].gpus == {"n1": ()} and jobs["b"].gpus == {"n1": ()}


def test_heartbeats_add_gpus_to_a_provider_job_and_flag_unknown_labels() -> None:
    topo = JobTopology()
    topo.replace("slurm", [slurm_job("slurm:1", "n1", "n2"), slurm_job("slurm:2", "n2")])
    topo.observe_rank("n2", "slurm:1", 5, 0.0)
    topo.observe_rank("n2", "slurm:3", 6, 0.0)
    jobs = topo.jobs(1.0)
    assert jobs["slurm:1"].gpus["n2"] == (5,)  # a node shared by two jobs: the rank says which GPU
    assert topo.take_unknown() == {"slurm:3"}


def test_prune_and_forget_node_drop_rank_reports() -> None:
    topo = JobTopology(member_ttl_s=30.0)
    topo.observe_rank("n1", "a", 0, 0.0)
    topo.observe_rank("n2", "a", 0, 20.0)
    topo.prune(40.0)
    assert topo.jobs(40.0)["a"].nodes == ("n2",)
    topo.forget_node("n2")
    assert topo.jobs(40.0) == {}


# --------------------------------------------------------------------------- jobs on GPU faults


def test_gpu_faults_get_the_job_the_summaries_last_saw_on_their_gpu() -> None:
    """Kernel Xid lines name a PCI address and NVML conditions a GPU index, never the job: the engine adds
    the job the agents' summaries last reported on that GPU (within the TTL), so rules can count jobs."""
    from watchd.detect.correlator import Correlator
    from watchd.model.events import Event

    def event(kind: str, t: float, **attrs: object) -> Event:
        return Event(id=f"{kind}-{t}", node="n1", source="test", kind=kind, time=t, attrs=attrs)  # type: ignore[arg-type]

    c = Correlator(topology=JobTopology(member_ttl_s=60))
    c.observe(event("gpu_summary", 100, gpu=2, pci_bus_id="00000000:3B:00.0", job="slurm:7"))
    c.observe(event("gpu_summary", 100, gpu=3, pci_bus_id="0000:3c:00.0"))  # no job on GPU 3
    xid = c.with_job(event("xid", 110, xid=13, pci_bus_id="0000:3b:00.0"))  # the kernel's short form
    assert xid.attrs == {"xid": 13, "pci_bus_id": "0000:3b:00.0", "job": "slurm:7"}
    assert c.with_job(event("gpu_health", 110, gpu=2, condition="dbe")).attrs["job"] == "slurm:7"
    for unchanged in (
        event("xid", 110, xid=13, pci_bus_id="0000:3c:00.0"),  # a GPU without a job
        event("xid", 110, xid=13, pci_bus_id="0000:99:00.0"),  # a GPU no summary named
        event("xid", 110, xid=13, pci_bus_id="0000:3b:00.0", job="slurm:8"),  # the event says
        event("xid", 161, xid=13, pci_bus_id="0000:3b:00.0"),  # the last summary is older than the TTL
        event("xid", 110, xid=79),  # no GPU named
        event("heartbeat", 110, gpu=2),  # not a GPU fault
    ):
        assert c.with_job(unchanged) is unchanged, unchanged
