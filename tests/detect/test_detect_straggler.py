"""Stragglers from hand-built windows and heartbeats: clock outliers, attribution, re-reports, parameters."""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping

import pytest
from pydantic import ValidationError

from watchd.detect.correlator import Correlator
from watchd.detect.finding import Finding
from watchd.detect.outliers import Outlier, _median_without, clock_outliers, node_outliers, whole_nodes
from watchd.detect.params import DetectorsConfig, StragglerParams
from watchd.detect.tracks import median
from watchd.jobs.model import JobInfo
from watchd.model.events import Event, stable_id

MODEL = "NVIDIA H100 80GB HBM3"
WS = 5.0
T0 = 1000.0
CLOCK = 2000.0

Key = tuple[str, int]


def window(
    node: str,
    gpu: int,
    t: float,
    job: str,
    clock: float = CLOCK,
    *,
    thermal: float = 0.0,
    power_brake: float = 0.0,
    hw_slowdown: float = 0.0,
    model: str | None = MODEL,
) -> Event:
    attrs: dict[str, str | int | float | bool | None] = {
        "gpu": gpu,
        "job": job,
        "window_s": WS,
        "util_mean": 97.0,
        "power_mean": 560.0,
        "sm_clock_mean": clock,
        "nvlink_tx_mean": 5e10,
        "nvlink_rx_mean": 5e10,
        "hw_slowdown_frac": hw_slowdown,
        "thermal_frac": thermal,
        "power_brake_frac": power_brake,
    }
    if model is not None:
        attrs["model"] = model
    return Event(stable_id(node, "gpu_summary", gpu, t), node, "nvml", "gpu_summary", t, attrs)


def heartbeat(node: str, gpu: int, rank: int, t: float, job: str, step: int, compute: float) -> Event:
    attrs: dict[str, str | int | float | bool | None] = {
        "job": job,
        "rank": rank,
        "gpu": gpu,
        "step": step,
        "step_time_s": 1.0,
        "compute_time_s": compute,
        "collective_seq": step,
        "phase": "train",
    }
    return Event(stable_id(node, "heartbeat", rank, t), node, "heartbeat", "heartbeat", t, attrs)


class Fleet:
    """Jobs on ``nodes`` x ``gpus`` GPUs; a window per GPU every 5 s and a detector cycle after each."""

    def __init__(self, config: DetectorsConfig | None = None) -> None:
        self.c = Correlator(config)
        self.jobs: dict[str, tuple[tuple[str, ...], int, str]] = {}
        self.t = T0
        self.findings: list[Finding] = []

    def add(self, job: str, nodes: tuple[str, ...], gpus: int = 4, partition: str = "gpu") -> Fleet:
        self.jobs[job] = (nodes, gpus, partition)
        self.c.topology.replace(
            "slurm", [JobInfo(j, n, "slurm", partition=p) for j, (n, _, p) in self.jobs.items()]
        )
        return self

    def gpus_of(self, job: str) -> list[Key]:
        nodes, gpus, _ = self.jobs[job]
        return [(n, g) for n in nodes for g in range(gpus)]

    def run_for(
        self,
        seconds: float,
        slow: Mapping[Key, dict[str, float]] | None = None,
        model: str | None = MODEL,
        heartbeats: Mapping[str, Mapping[int, float]] | None = None,
    ) -> list[Finding]:
        """``slow``: per GPU, window overrides (clock, thermal ...); ``heartbeats``: job -> rank -> compute"""
        out: list[Finding] = []
        for _ in range(round(seconds / WS)):
            self.t += WS
            for job in self.jobs:
                for rank, (node, gpu) in enumerate(self.gpus_of(job)):
                    over = dict((slow or {}).get((node, gpu), {}))
                    clock = over.pop("clock", CLOCK)
                    self.c.observe(window(node, gpu, self.t, job, clock, model=model, **over))
                    if heartbeats and job in heartbeats:
                        compute = heartbeats[job].get(rank, 0.7)
                        step = round((self.t - T0) / WS)
                        self.c.observe(heartbeat(node, gpu, rank, self.t, job, step, compute))
            found = self.c.run(self.t)
            self.findings += found
            out += found
        return out


def stragglers(findings: list[Finding], job: str | None = None) -> list[Finding]:
    return [f for f in findings if f.kind == "straggler" and (job is None or f.job == job)]


def one_job(
    config: DetectorsConfig | None = None, gpus: int = 4, nodes: int = 2, model: str | None = MODEL
) -> Fleet:
    fleet = Fleet(config).add("slurm:1", tuple(f"n{i + 1}" for i in range(nodes)), gpus)
    assert fleet.run_for(60.0, model=model) == []
    return fleet


SLOW_GPU: Key = ("n2", 1)


# --------------------------------------------------------------------------- hardware stragglers


def test_thermal_straggler_is_hardware_after_for_s() -> None:
    fleet = one_job()
    fault_at = fleet.t
    fleet.run_for(400.0, {SLOW_GPU: {"clock": 0.7 * CLOCK, "thermal": 1.0}})
    found = stragglers(fleet.findings)
    assert found, "no straggler found"
    first = found[0]
    assert first.time - fault_at >= fleet.c.config.straggler.for_s
    assert first.time - fault_at <= fleet.c.config.straggler.for_s + 60.0
    assert (first.culprit_node, first.culprit_gpu) == SLOW_GPU
    assert first.hardware is True
    assert "thermal" in first.evidence
    assert first.signal == "nvml"
    assert first.extra["metric"] == "sm_clock"
    assert first.extra["deviation"] == pytest.approx(-0.3)
    assert first.to_event().node == "n2"
    assert all((f.culprit_node, f.culprit_gpu) == SLOW_GPU for f in found)


def test_power_brake_reason_is_hardware() -> None:
    fleet = one_job()
    fleet.run_for(300.0, {SLOW_GPU: {"clock": 0.35 * CLOCK, "power_brake": 1.0, "hw_slowdown": 1.0}})
    first = stragglers(fleet.findings)[0]
    assert first.hardware is True and "power_brake" in first.evidence


def test_clock_15_percent_low_without_reason_is_hardware_by_the_fleet_median() -> None:
    fleet = one_job()
    fleet.run_for(300.0, {SLOW_GPU: {"clock": 0.85 * CLOCK}})
    first = stragglers(fleet.findings)[0]
    assert (first.culprit_node, first.culprit_gpu) == SLOW_GPU
    assert first.hardware is True
    assert "below the fleet median" in first.evidence


def test_clock_15_percent_low_without_reason_or_model_reference_is_software() -> None:
    fleet = one_job(model=None)
    fleet.run_for(300.0, {SLOW_GPU: {"clock": 0.85 * CLOCK}}, model=None)  # no model: no fleet reference
    first = stragglers(fleet.findings)[0]
    assert first.hardware is False
    assert "software imbalance" in first.evidence


def test_hardware_event_on_the_gpu_attributes_a_slow_clock() -> None:
    fleet = one_job(model=None)
    fleet.c.observe(
        Event(
            "h1",
            "n2",
            "nvml",
            "gpu_health",
            fleet.t,
            {"condition": "pcie_downtrain", "gpu": 1, "value": 1, "evidence": "x8"},
        )
    )
    fleet.run_for(300.0, {SLOW_GPU: {"clock": 0.85 * CLOCK}}, model=None)
    first = stragglers(fleet.findings)[0]
    assert first.hardware is True
    assert "pcie_downtrain" in first.evidence


def test_an_infiniband_port_down_on_the_node_is_no_cause_of_a_slow_clock() -> None:
    fleet = one_job(model=None)
    attrs: dict[str, object] = {"condition": "port_down", "device": "mlx5_0", "port": 1, "value": 1}
    fleet.c.observe(Event("i1", "n2", "ib-sysfs", "ib_port_health", fleet.t, attrs))  # type: ignore[arg-type]
    fleet.run_for(300.0, {SLOW_GPU: {"clock": 0.85 * CLOCK}}, model=None)
    first = stragglers(fleet.findings)[0]
    assert first.hardware is False


# --------------------------------------------------------------------------- thresholds and noise


def test_clock_exactly_clock_drop_below_the_median_is_a_straggler() -> None:
    fleet = one_job()
    drop = fleet.c.config.straggler.clock_drop
    fleet.run_for(300.0, {SLOW_GPU: {"clock": CLOCK * (1 - drop)}})
    assert [(f.culprit_node, f.culprit_gpu) for f in stragglers(fleet.findings)][:1] == [SLOW_GPU]


def test_clock_just_above_the_clock_drop_threshold_is_not() -> None:
    fleet = one_job()
    drop = fleet.c.config.straggler.clock_drop
    fleet.run_for(300.0, {SLOW_GPU: {"clock": CLOCK * (1 - drop) + 1.0}})
    assert fleet.findings == []


def test_mad_test_keeps_a_noisy_job_quiet() -> None:
    p = StragglerParams()
    noisy = [1900.0, 2100.0, 1950.0, 2050.0, 1920.0, 2080.0, 2000.0]  # +-100 MHz of per-GPU noise
    clocks = {("n1", i): c for i, c in enumerate(noisy)}
    assert clock_outliers({**clocks, ("n2", 0): 1890.0}, p) == []  # 5.5% low, inside the noise
    # 24% low is still inside 5 scaled MADs of this noise (median 1975, MAD 75: 5 x 1.4826 x 75 = 556 MHz)
    assert clock_outliers({**clocks, ("n2", 0): 1500.0}, p) == []
    [o] = clock_outliers({**clocks, ("n2", 0): 1200.0}, p)  # 775 MHz below: outside it
    assert (o.node, o.gpu, o.metric) == ("n2", 0, "sm_clock")
    assert o.job_median == 1975.0
    assert o.deviation == pytest.approx(1200.0 / 1975.0 - 1)


def test_noisy_clocks_give_no_straggler_over_minutes() -> None:
    fleet = one_job()
    jitter = {
        key: {"clock": CLOCK + 15.0 * ((i * 7) % 5 - 2)} for i, key in enumerate(fleet.gpus_of("slurm:1"))
    }
    jitter[SLOW_GPU] = {"clock": 0.97 * CLOCK}  # 3% low: below the 5% clock_drop
    fleet.run_for(600.0, jitter)
    assert fleet.findings == []


def test_a_quarter_of_the_job_slow_is_no_single_straggler() -> None:
    fleet = one_job()
    slow = {key: {"clock": 0.7 * CLOCK, "thermal": 1.0} for key in [("n1", 0), ("n2", 1)]}  # 2 of 8
    fleet.run_for(400.0, slow)
    assert fleet.findings == []


def test_one_of_eight_slow_is_a_straggler_but_two_of_eight_is_not() -> None:
    p = StragglerParams()
    clocks = {("n", i): CLOCK for i in range(8)}
    assert len(clock_outliers({**clocks, ("n", 0): 1400.0}, p)) == 1
    assert clock_outliers({**clocks, ("n", 0): 1400.0, ("n", 1): 1400.0}, p) == []


def test_one_slow_gpu_of_a_four_gpu_job_is_a_straggler_at_the_default_min_gpus() -> None:
    p = StragglerParams()
    assert p.min_gpus == 4
    four = {("n", i): CLOCK for i in range(4)}
    assert [o.gpu for o in clock_outliers({**four, ("n", 2): 1400.0}, p)] == [2]
    assert clock_outliers({**four, ("n", 1): 1400.0, ("n", 2): 1400.0}, p) == []
    assert clock_outliers({("n", i): CLOCK for i in range(3)} | {("n", 0): 1400.0}, p) == []  # under min_gpus


# --------------------------------------------------------------------------- a whole node slow


def test_node_outliers_name_the_one_node_below_the_others() -> None:
    p = StragglerParams()
    two = {(n, g): CLOCK for n in ("a", "b") for g in range(8)}
    braked = {**two, **{("b", g): 0.6 * CLOCK for g in range(8)}}
    assert [(o.node, o.gpu, o.metric) for o in node_outliers(braked, p)] == [("b", None, "node_sm_clock")]
    assert node_outliers(two, p) == []
    assert node_outliers({**two, **{("b", g): 0.97 * CLOCK for g in range(8)}}, p) == []  # under clock_drop
    four = {(n, g): CLOCK for n in "abcd" for g in range(8)}
    assert node_outliers({**four, **{(n, g): 0.6 * CLOCK for n in "cd" for g in range(8)}}, p) == []
    assert node_outliers({("a", g): CLOCK for g in range(8)}, p) == []  # one node: no peers


def test_node_outliers_peers_median_is_the_others_median() -> None:
    """Each node's peers are the median of the other nodes' medians, computed without a sort per node (a job
    of 512 nodes took a quarter of a million comparisons a cycle): the same figure as sorting the others."""
    rng = random.Random(7)
    for n in (2, 3, 4, 5, 8, 33, 128):
        for _ in range(20):
            # ties included: a node's median equal to others' must leave out one of them, not all
            values = [rng.choice((1900.0, 1950.0, rng.uniform(1e3, 2e3))) for _ in range(n)]
            ordered = sorted(values)
            for i, v in enumerate(values):
                assert _median_without(ordered, v) == median(values[:i] + values[i + 1 :])
    p = StragglerParams()
    nodes = [f"n{i:03d}" for i in range(512)]
    clocks = {(n, g): CLOCK * (1 + rng.uniform(-0.004, 0.004)) for n in nodes for g in range(8)}
    clocks |= {("n137", g): 0.6 * CLOCK for g in range(8)}
    found = node_outliers(clocks, p)
    assert [(o.node, o.metric) for o in found] == [("n137", "node_sm_clock")]
    medians = {n: median([clocks[(n, g)] for g in range(8)]) for n in nodes}
    assert found[0].job_median == median([m for n, m in medians.items() if n != "n137"])


def test_outliers_on_most_of_a_node_become_one_for_the_node() -> None:
    clocks = {(n, g): CLOCK for n in ("a", "b") for g in range(8)}
    gpu = [Outlier("b", g, None, "sm_clock", 1200.0, CLOCK, -0.4) for g in range(5)]
    [node] = whole_nodes(gpu, clocks)
    assert (node.node, node.gpu, node.metric, node.value) == ("b", None, "node_sm_clock", 1200.0)
    assert whole_nodes(gpu[:1], clocks) == gpu[:1]  # one GPU of eight: that GPU
    assert whole_nodes(gpu[:4], clocks) == gpu[:4]  # half the node: still per GPU


def test_a_power_braked_node_of_a_two_node_job_is_one_hardware_finding_for_the_node() -> None:
    fleet = one_job(gpus=8)
    braked = {("n2", g): {"clock": 0.6 * CLOCK, "power_brake": 1.0} for g in range(8)}
    fleet.run_for(300.0, braked)
    found = stragglers(fleet.findings)
    assert found, "no straggler found"
    assert {(f.culprit_node, f.culprit_gpu, f.extra["metric"]) for f in found} == {
        ("n2", None, "node_sm_clock")
    }
    assert (
        found[0].hardware is True
        and "power_brake" in found[0].evidence
        and "8 of the node's 8" in found[0].evidence
    )


def test_a_slow_node_without_a_hardware_cause_gives_no_node_finding() -> None:
    fleet = one_job(gpus=8, model=None)  # no model: no fleet median to fall below
    fleet.run_for(300.0, {("n2", g): {"clock": 0.6 * CLOCK} for g in range(8)}, model=None)
    assert stragglers(fleet.findings) == []


# --------------------------------------------------------------------------- heartbeat compute time


def test_heartbeat_compute_outlier_without_hardware_cause_is_software_imbalance() -> None:
    fleet = Fleet().add("slurm:1", ("n1", "n2"))
    fleet.run_for(300.0, heartbeats={"slurm:1": {5: 0.7 * 1.4}})  # rank 5 = n2 GPU 1; clocks all equal
    found = stragglers(fleet.findings)
    assert found, "no straggler found"
    first = found[0]
    assert first.hardware is False
    assert first.evidence == "no hardware cause: software imbalance"
    assert "software imbalance" in first.summary
    assert first.signal == "heartbeat"
    assert (first.culprit_node, first.culprit_gpu) == SLOW_GPU
    assert first.extra["metric"] == "compute_time"
    assert first.extra["rank"] == 5
    assert [f.kind for f in fleet.findings if f.kind != "straggler"] == []  # advancing steps: no hang


def test_heartbeat_compute_within_compute_drop_is_nothing() -> None:
    fleet = Fleet().add("slurm:1", ("n1", "n2"))
    fleet.run_for(300.0, heartbeats={"slurm:1": {5: 0.7 * 1.05}})  # 5% slower: below compute_drop (10%)
    assert fleet.findings == []


def test_a_quarter_of_the_ranks_slow_in_compute_is_no_single_straggler() -> None:
    fleet = Fleet().add("slurm:1", ("n1", "n2"))  # 16 ranks
    fleet.run_for(300.0, heartbeats={"slurm:1": {r: 0.7 * 1.4 for r in (2, 5, 9, 13)}})  # 4 of 16
    assert stragglers(fleet.findings) == []


def test_clock_outlier_and_compute_outlier_on_the_same_gpu_report_once() -> None:
    fleet = Fleet().add("slurm:1", ("n1", "n2"))
    fleet.run_for(60.0, heartbeats={"slurm:1": {}})
    fleet.run_for(
        300.0, {SLOW_GPU: {"clock": 0.7 * CLOCK, "thermal": 1.0}}, heartbeats={"slurm:1": {5: 0.7 * 1.4}}
    )
    found = stragglers(fleet.findings)
    assert found
    assert {(f.culprit_node, f.culprit_gpu, f.extra["metric"]) for f in found} == {("n2", 1, "sm_clock")}
    times = [f.time for f in found]
    assert len(times) == len(set(times))  # one finding per cycle, not one per metric


# --------------------------------------------------------------------------- re-reports, min_gpus


def test_re_reported_every_report_every_s_with_growing_duration() -> None:
    fleet = one_job()
    fleet.run_for(600.0, {SLOW_GPU: {"clock": 0.7 * CLOCK, "thermal": 1.0}})
    found = stragglers(fleet.findings)
    p = fleet.c.config.straggler
    assert len(found) >= 5
    assert [b.time - a.time for a, b in itertools.pairwise(found)] == [p.report_every_s] * (len(found) - 1)
    durations = [f.to_event().attrs["duration_s"] for f in found]
    assert durations[0] == p.for_s
    assert durations == [p.for_s + i * p.report_every_s for i in range(len(found))]
    assert [f.revision for f in found] == list(range(len(found)))
    assert len({f.onset for f in found}) == 1


def test_straggler_that_clears_ends_and_a_later_one_is_new() -> None:
    fleet = one_job()
    slow = {SLOW_GPU: {"clock": 0.7 * CLOCK, "thermal": 1.0}}
    fleet.run_for(240.0, slow)
    first = stragglers(fleet.findings)
    assert first
    fleet.run_for(180.0)  # healthy for 3 minutes: the episode clears
    count = len(stragglers(fleet.findings))
    assert count == len(first)
    fleet.run_for(240.0, slow)
    later = stragglers(fleet.findings)[count:]
    assert later and later[0].revision == 0 and later[0].onset > first[0].onset


@pytest.mark.parametrize(("min_gpus", "found"), [(4, True), (5, True), (6, False)])
def test_fewer_than_min_gpus_gives_nothing(min_gpus: int, found: bool) -> None:
    fleet = one_job(DetectorsConfig(straggler=StragglerParams(min_gpus=min_gpus)), gpus=5, nodes=1)
    fleet.run_for(300.0, {("n1", 2): {"clock": 0.7 * CLOCK, "thermal": 1.0}})  # 1 of 5 GPUs slow
    assert bool(stragglers(fleet.findings)) is found


def test_straggler_disabled_gives_nothing() -> None:
    fleet = one_job(DetectorsConfig(straggler=StragglerParams(enabled=False)))
    fleet.run_for(300.0, {SLOW_GPU: {"clock": 0.7 * CLOCK, "thermal": 1.0}})
    assert fleet.findings == []


# --------------------------------------------------------------------------- per-partition overrides


def test_partition_override_changes_thresholds_for_that_partition_only() -> None:
    config = DetectorsConfig(partitions={"inference": {"straggler": {"for_s": 120}}})
    assert config.straggler.for_s == 30.0
    fleet = Fleet(config).add("slurm:1", ("a1", "a2"), partition="inference").add("slurm:2", ("b1", "b2"))
    fleet.run_for(60.0)
    fault_at = fleet.t
    slow = {
        ("a2", 1): {"clock": 0.7 * CLOCK, "thermal": 1.0},
        ("b2", 1): {"clock": 0.7 * CLOCK, "thermal": 1.0},
    }
    fleet.run_for(300.0, slow)
    slow_p, default = stragglers(fleet.findings, "slurm:1"), stragglers(fleet.findings, "slurm:2")
    assert slow_p and default
    assert slow_p[0].partition == "inference"
    assert slow_p[0].to_event().attrs["duration_s"] == 120.0
    assert default[0].to_event().attrs["duration_s"] == 30.0
    assert default[0].time - fault_at < 120.0 <= slow_p[0].time - fault_at


def test_partition_override_merges_with_the_top_level() -> None:
    config = DetectorsConfig(
        straggler=StragglerParams(for_s=200.0, min_gpus=6),
        partitions={"inference": {"straggler": {"for_s": 30}}},
    )
    p = config.for_partition("inference")
    assert p.straggler.for_s == 30.0
    assert p.straggler.min_gpus == 6  # from the top level
    assert config.for_partition("gpu").straggler.for_s == 200.0  # a partition without overrides
    assert config.for_partition(None).straggler.for_s == 200.0


def test_partition_can_disable_the_hang_detector() -> None:
    config = DetectorsConfig(partitions={"inference": {"hang": {"enabled": False}}})
    assert config.for_partition("inference").hang.enabled is False
    assert config.for_partition("gpu").hang.enabled is True


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"stragler": {"for_s": 30}}, "unknown key 'stragler'"),
        ({"straggler": {"for_sec": 30}}, "for_sec"),
        ({"straggler": {"for_s": -1}}, "for_s"),
        ({"hang": {"fraction": 1.5}}, "fraction"),
    ],
)
def test_bad_partition_override_names_the_partition(override: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        DetectorsConfig(partitions={"inference": override})
    text = str(info.value)
    assert "partitions.inference" in text
    assert message in text


def _first_straggler_delay(config: DetectorsConfig, with_other_partition_job: bool) -> float:
    fleet = Fleet(config).add("slurm:1", ("b1", "b2"))
    if with_other_partition_job:
        fleet.add("slurm:2", ("a1", "a2"), partition="batch")  # a healthy job in the overridden partition
    fleet.run_for(60.0)
    fault_at = fleet.t
    fleet.run_for(400.0, {("b2", 1): {"clock": 0.7 * CLOCK, "thermal": 1.0}})
    return stragglers(fleet.findings, "slurm:1")[0].time - fault_at


def test_window_override_of_another_partition_does_not_change_this_jobs_detection() -> None:
    config = DetectorsConfig(partitions={"batch": {"straggler": {"window_s": 240}}})
    alone = _first_straggler_delay(config, with_other_partition_job=False)
    beside = _first_straggler_delay(config, with_other_partition_job=True)
    assert beside == alone
