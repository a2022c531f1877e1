"""Node-hours in service, checkpoint timing from heartbeats, and the report, over synthetic histories
(watchd.reliability.service, .jobs, .report, .evidence): plain data, every time passed in."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchd.model.events import Event
from watchd.reliability.estimate import mtbf
from watchd.reliability.evidence import hardware_evidence
from watchd.reliability.jobs import JobTracker
from watchd.reliability.report import Failure, NodeInfo, advise, build_report
from watchd.reliability.service import Interval, ServiceTracker

H = 3600.0


def exposure(intervals: list[Interval]) -> dict[str, float]:
    out: dict[str, float] = {}
    for iv in intervals:
        out[iv.node] = out.get(iv.node, 0.0) + iv.end - iv.start
    return out


def test_reports_within_the_gap_are_one_interval_and_a_silence_splits_it() -> None:
    s = ServiceTracker(gap_s=300)
    for t in range(0, 3601, 60):
        s.seen("n1", float(t))
    for t in range(4200, 7201, 60):  # 600 s of silence: not in service meanwhile
        s.seen("n1", float(t))
    assert s.take() == [Interval("n1", 0.0, 3600.0), Interval("n1", 4200.0, 7200.0)]


def test_a_failure_ends_service_until_a_new_job_or_a_resume() -> None:
    s = ServiceTracker(gap_s=300)
    for t in range(0, 3601, 60):
        s.seen("n1", float(t), job="slurm:1")
    s.failed("n1", 1800.0)  # reported late: what came after the failure is not exposure
    s.seen("n1", 4000.0, job="slurm:1")  # the job it ran is still listed: still out
    assert s.nodes["n1"].out_since == 1800.0
    s.seen("n1", 5000.0, job="slurm:2")  # a new job: back in service
    s.seen("n1", 5200.0)
    assert exposure(s.take()) == {"n1": 1800.0 + 200.0}
    s.failed("n1", 6000.0)
    assert s.restored("n1", 9000.0) == 6000.0 and s.nodes["n1"].out_since is None


histories = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0, 1e5), st.booleans()), min_size=1, max_size=200
)


@given(histories, st.floats(1.0, 1e4))
def test_exposure_never_exceeds_the_span_of_reports_and_never_overlaps(history: list, gap: float) -> None:
    s = ServiceTracker(gap_s=gap)
    collected: list[Interval] = []
    for node, t, fail in sorted(history, key=lambda h: h[1]):
        if fail:
            s.failed(node, t)
        else:
            s.seen(node, t)
        collected += s.take()
    # the store keeps one row per (node, start), extending its end: do the same
    rows: dict[tuple[str, float], float] = {}
    for iv in collected:
        rows[(iv.node, iv.start)] = max(rows.get((iv.node, iv.start), iv.end), iv.end)
    for node in {h[0] for h in history}:
        times = [t for n, t, f in history if n == node and not f]
        spans = sorted((start, end) for (n, start), end in rows.items() if n == node)
        for (_, e1), (s2, _) in itertools.pairwise(spans):
            assert e1 <= s2
        total = sum(e - st_ for st_, e in spans)
        assert total <= (max(times) - min(times) if times else 0.0) + 1e-6


def test_checkpoint_cost_and_interval_from_the_reference_ranks_phases() -> None:
    j = JobTracker()
    j.heartbeat("slurm:1", 3, "train", 0.0, "n2")
    j.heartbeat("slurm:1", 0, "train", 1.0, "n1")  # rank 0 becomes the reference
    for start in (1000.0, 2900.0, 4800.0):
        j.heartbeat("slurm:1", 0, "checkpoint", start, "n1")
        j.heartbeat("slurm:1", 3, "checkpoint", start + 5, "n2")  # other ranks do not count twice
        j.heartbeat("slurm:1", 0, "train", start + 100, "n1")
    state = j.jobs["slurm:1"]
    assert state.cost_s == 100.0 and state.interval_s == 1800.0 and state.nodes == {"n1", "n2"}
    assert state.since_checkpoint(5000.0) == 100.0


def test_advice_uses_the_measured_cost_and_flags_a_job_far_off() -> None:
    j = JobTracker()
    j.heartbeat("slurm:1", 0, "checkpoint", 0.0, "n1")
    j.heartbeat("slurm:1", 0, "train", 60.0, "n1")
    est = mtbf(1000 * H, 10)  # node MTBF 100 h
    a = advise(j.jobs["slurm:1"], nodes=100, partition=None, estimate=est, now=60.0 + 6 * H)
    assert a is not None
    assert a.job_mtbf_s == pytest.approx(H)  # 100 h / 100 nodes
    assert a.cost_s == 60.0 and a.cost_source == "heartbeats" and a.current_basis == "since last checkpoint"
    assert a.far_too_long and a.waste_current is not None and a.waste_current > a.waste_advised
    # no failure yet: the lower bound is used; no cost measured and none configured: no advice
    none_yet = mtbf(1000 * H, 0)
    j.heartbeat("slurm:2", 0, "train", 0.0, "n1")
    assert advise(j.jobs["slurm:2"], nodes=1, partition=None, estimate=none_yet, now=10.0) is None
    b = advise(j.jobs["slurm:2"], nodes=1, partition=None, estimate=none_yet, now=10.0, default_cost_s=30.0)
    assert b is not None and b.mtbf_basis.startswith("lower bound") and b.cost_source == "config"
    assert not b.far_too_long


def test_the_report_per_node_model_and_partition_with_lemons_and_gpu_hours_lost() -> None:
    info = {
        "a": NodeInfo("H200", 8, ("p1",)),
        "b": NodeInfo("H200", 8, ("p1", "p2")),
        "c": NodeInfo("A100", 4, ("p2",)),
    }
    intervals = [Interval(n, 0.0, 100 * H) for n in "abc"]
    failures = [
        Failure(10 * H, "a", "xid-fatal-hardware", "xid 79 (RESTART_BM)", "enforce", 0, 12 * H),
        Failure(50 * H, "a", "xid-fatal-hardware", "xid 48 (WORKFLOW_XID_48)", "enforce", 1, None),
        Failure(70 * H, "c", "hang-hardware-culprit", "nccl_hang (gpu_lost)", "enforce", 2, 71 * H),
    ]
    r = build_report(now=100 * H, since=0.0, intervals=intervals, failures=failures, info=info)
    assert r.fleet.failures == 3 and r.fleet.exposure_s == 300 * H
    assert r.models["H200"].failures == 2 and r.models["A100"].failures == 1
    assert r.partitions["p1"].exposure_s == 200 * H and r.partitions["p2"].failures == 1
    assert r.nodes["a"].mtbf == 50 * H and r.lemons == [("a", 2)]
    assert r.gpu_hours_lost == pytest.approx(2 * 8 + 50 * 8 + 1 * 4)
    only = build_report(
        now=100 * H, since=0.0, intervals=intervals, failures=failures, info=info, partition="p2"
    )
    assert set(only.nodes) == {"b", "c"} and only.fleet.failures == 1
    later = build_report(now=100 * H, since=60 * H, intervals=intervals, failures=failures, info=info)
    assert later.fleet.failures == 1 and later.fleet.exposure_s == 120 * H


@given(
    st.lists(st.tuples(st.sampled_from("abcdef"), st.floats(0, 1000)), max_size=50),
    st.lists(st.tuples(st.sampled_from("abcdef"), st.floats(0, 500), st.floats(0, 500)), max_size=50),
)
def test_groups_add_up_to_the_fleet(fails: list, spans: list) -> None:
    info = {n: NodeInfo("H200" if n < "d" else "B200", 8, ("p1" if n < "c" else "p2",)) for n in "abcdef"}
    intervals = [Interval(n, min(a, b), max(a, b)) for n, a, b in spans]
    failures = [Failure(t, n, "r", "xid 79 (RESTART_BM)", "enforce") for n, t in fails]
    r = build_report(now=1000.0, since=0.0, intervals=intervals, failures=failures, info=info)
    for groups in (r.models, r.partitions):
        assert sum(g.failures for g in groups.values()) == r.fleet.failures == len(fails)
        assert sum(g.exposure_s for g in groups.values()) == pytest.approx(r.fleet.exposure_s)
    assert sum(e.failures for e in r.nodes.values()) == len(fails)


def ev(kind: str, **attrs: object) -> Event:
    return Event("e", "n1", "test", kind, 0.0, dict(attrs))  # type: ignore[arg-type]


def test_what_counts_as_hardware_evidence() -> None:
    assert hardware_evidence(ev("xid", xid=79, bucket="RESTART_BM")) == "xid 79 (RESTART_BM)"
    assert hardware_evidence(ev("xid", xid=48)) == "xid 48 (WORKFLOW_XID_48)"  # bucket from the catalog
    assert hardware_evidence(ev("xid", xid=13, bucket="RESTART_APP")) is None
    assert hardware_evidence(ev("gpu_health", condition="gpu_lost", value=1)) == "gpu_health gpu_lost"
    assert hardware_evidence(ev("gpu_health", condition="gpu_lost", value=0)) is None
    assert hardware_evidence(ev("nccl_hang", hardware=True, evidence="xid")) == "nccl_hang (xid)"
    assert hardware_evidence(ev("straggler", hardware=False)) is None
    assert hardware_evidence(ev("watchd_action", action="drain")) is None
