"""The detector interface: the registry, the correlator looping over registered detectors and remembering
episodes (with fake detectors), and each real detector judged alone with only its own parameters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from watchd.detect.correlator import Correlator
from watchd.detect.detector import Cycle, Onset, Persisting, Sighting
from watchd.detect.finding import KINDS, Finding
from watchd.detect.fleet import FleetState
from watchd.detect.hang import HangDetector, HangDetectorParams
from watchd.detect.host_stall import HostStallDetector, HostStallDetectorParams
from watchd.detect.params import (
    DetectorParams,
    DetectorsConfig,
    HangParams,
    HeartbeatParams,
    HostStallParams,
    StragglerParams,
)
from watchd.detect.registry import DETECTORS
from watchd.detect.straggler import StragglerDetector
from watchd.jobs.model import JobInfo
from watchd.jobs.topology import JobView
from watchd.model.events import Event, Scalar, stable_id

JOB = "slurm:1"
WS = 5.0
T0 = 1000.0


def finding(culprit: str | None = None, hardware: bool = False, onset: float = T0) -> Finding:
    return Finding("fake", JOB, T0, onset, "fake", 0.5, hardware=hardware, culprit_node=culprit)


@dataclass
class FakeDetector:
    """Returns what the test sets; records what it was asked (job, time, its parameters)."""

    name: str
    sightings: Sequence[Sighting] = ()
    asked: list[tuple[str, float, float]] = field(default_factory=list)

    def params(self, of: DetectorParams) -> float:
        return of.hang.for_s

    def judge(self, cycle: Cycle, job: JobView, params: float) -> Sequence[Sighting]:
        self.asked.append((job.id, cycle.now, params))
        return self.sightings


def correlator(*detectors: FakeDetector, config: DetectorsConfig | None = None) -> Correlator:
    c = Correlator(config, detectors=detectors)
    c.topology.replace(
        "slurm",
        [
            JobInfo(JOB, ("n1",), "slurm", partition="gpu"),
            JobInfo("slurm:2", ("n2",), "slurm", partition="batch"),
        ],
    )
    return c


# --------------------------------------------------------------------------- registry, correlator loop


def test_the_registry_lists_hang_host_stall_and_straggler_in_precedence_order() -> None:
    names = [d.name for d in DETECTORS]
    assert names.index("nccl_hang") < names.index("host_stall") < names.index("straggler")
    assert set(names) <= set(KINDS)  # each detector names the kind of finding it reports


def test_every_registered_detector_judges_every_job_with_its_own_partitions_parameters() -> None:
    first, second = FakeDetector("a"), FakeDetector("b")
    c = correlator(first, second, config=DetectorsConfig(partitions={"batch": {"hang": {"for_s": 40}}}))
    assert c.run(T0) == []
    assert sorted(first.asked) == sorted(second.asked) == [(JOB, T0, 10.0), ("slurm:2", T0, 40.0)]


def test_the_first_detector_that_sees_a_condition_ends_the_jobs_turn() -> None:
    first = FakeDetector("a", [Onset(("a",), finding())])
    second = FakeDetector("b")
    c = correlator(first, second)
    assert [f.kind for f in c.run(T0)] == ["fake", "fake"]  # one per job
    assert len(first.asked) == 2 and second.asked == []


def test_the_correlator_runs_the_registered_detectors_by_default() -> None:
    assert Correlator().detectors == DETECTORS


# --------------------------------------------------------------------------- episodes


def test_an_onset_is_reported_once_then_again_only_when_its_finding_grows_stronger() -> None:
    detector = FakeDetector("a", [Onset(("a",), finding())])
    c = correlator(detector)
    c.topology.replace("slurm", [JobInfo(JOB, ("n1",), "slurm")])
    [first] = c.run(T0)
    assert first.revision == 0
    assert c.run(T0 + 5) == []
    detector.sightings = [Onset(("a",), finding(culprit="n1"))]
    [better] = c.run(T0 + 10)
    assert (better.revision, better.culprit_node) == (1, "n1")
    detector.sightings = [Onset(("a",), finding())]  # weaker again: nothing
    assert c.run(T0 + 15) == []
    detector.sightings = [Onset(("a",), finding(culprit="n1", hardware=True))]
    assert [f.revision for f in c.run(T0 + 20)] == [2]


def test_a_persisting_condition_is_reported_after_for_s_then_every_every_s() -> None:
    built: list[tuple[float, int]] = []

    def build(onset: float, revision: int) -> Finding:
        built.append((onset, revision))
        return replace(finding(onset=onset), revision=revision)

    c = correlator(FakeDetector("a", [Persisting(("a", "n1"), 20.0, 30.0, build)]))
    c.topology.replace("slurm", [JobInfo(JOB, ("n1",), "slurm")])
    reported = {t: c.run(t) for t in (T0 + 5 * i for i in range(15))}
    assert [t for t, fs in reported.items() if fs] == [T0 + 20, T0 + 50]
    assert built == [(T0, 0), (T0, 1)]  # built only when due


def test_a_persisting_condition_not_worth_reporting_is_asked_again_next_cycle() -> None:
    worth = [False, False, True]

    def build(onset: float, revision: int) -> Finding | None:
        return finding(onset=onset) if worth.pop(0) else None

    c = correlator(FakeDetector("a", [Persisting(("a",), 10.0, 60.0, build)]))
    c.topology.replace("slurm", [JobInfo(JOB, ("n1",), "slurm")])
    found = [c.run(T0 + 5 * i) for i in range(6)]
    assert [len(fs) for fs in found] == [0, 0, 0, 0, 1, 0]
    assert found[4][0].revision == 0 and found[4][0].onset == T0


def test_a_condition_gone_for_clear_after_s_ends_and_a_later_one_is_new() -> None:
    detector = FakeDetector("a", [Onset(("a",), finding())])
    c = correlator(detector, config=DetectorsConfig(clear_after_s=30.0))
    c.topology.replace("slurm", [JobInfo(JOB, ("n1",), "slurm")])
    assert len(c.run(T0)) == 1
    detector.sightings = []
    c.run(T0 + 25)
    detector.sightings = [Onset(("a",), finding())]
    assert c.run(T0 + 29) == []  # back within clear_after_s: the same episode
    detector.sightings = []
    c.run(T0 + 59)
    assert len(c.episodes) == 0
    detector.sightings = [Onset(("a",), finding())]
    assert len(c.run(T0 + 60)) == 1


# --------------------------------------------------------------------------- real detectors, alone

LEVELS = {
    "compute": (97.0, 560.0, 1.2e11, 1980.0),
    "spin": (100.0, 245.0, 2e5, 1980.0),
    "idle": (0.0, 90.0, 1e4, 345.0),
}


def window(
    node: str, gpu: int, t: float, state: str, clock: float | None = None, thermal: float = 0.0
) -> Event:
    util, power, link, sm_clock = LEVELS[state]
    attrs: dict[str, Scalar] = {
        "gpu": gpu,
        "job": JOB,
        "model": "NVIDIA H100 80GB HBM3",
        "window_s": WS,
        "util_mean": util,
        "power_mean": power,
        "sm_clock_mean": sm_clock if clock is None else clock,
        "nvlink_tx_mean": link / 2,
        "nvlink_rx_mean": link / 2,
        "hw_slowdown_frac": 0.0,
        "thermal_frac": thermal,
        "power_brake_frac": 0.0,
    }
    return Event(stable_id(node, "gpu_summary", gpu, t), node, "nvml", "gpu_summary", t, attrs)


class Scene:
    """One job on 2 nodes x 4 GPUs in a bare FleetState (no correlator): windows every 5 s."""

    def __init__(self) -> None:
        self.fleet = FleetState()
        self.fleet.topology.replace("slurm", [JobInfo(JOB, ("n1", "n2"), "slurm")])
        self.t = T0

    def run_for(self, seconds: float, state: str, **gpu1_of_n2: float) -> None:
        for _ in range(round(seconds / WS)):
            self.t += WS
            for node in ("n1", "n2"):
                for gpu in range(4):
                    over = gpu1_of_n2 if (node, gpu) == ("n2", 1) else {}
                    self.fleet.observe(window(node, gpu, self.t, state, **over))

    def judge(
        self, detector: HangDetector | HostStallDetector | StragglerDetector, params: object
    ) -> list[Sighting]:
        cycle = Cycle(self.fleet, self.t, DetectorParams())
        view = self.fleet.topology.jobs(self.t)[JOB]
        return list(detector.judge(cycle, view, params))  # type: ignore[arg-type]


def test_the_hang_detector_alone_sees_a_hang_after_its_own_for_s() -> None:
    scene = Scene()
    scene.run_for(60.0, "compute")
    params = HangDetectorParams(HangParams(for_s=10.0), HeartbeatParams())
    scene.run_for(5.0, "spin")
    assert scene.judge(HangDetector(), params) == []
    scene.run_for(5.0, "spin")
    [sighting] = scene.judge(HangDetector(), params)
    assert isinstance(sighting, Onset) and sighting.finding.kind == "nccl_hang"
    assert sighting.finding.onset == T0 + 60.0


def test_the_host_stall_detector_alone_sees_all_gpus_idle_after_its_own_for_s() -> None:
    scene = Scene()
    scene.run_for(60.0, "compute")
    scene.run_for(30.0, "idle")
    params = HostStallDetectorParams(HostStallParams(for_s=30.0), HangParams())
    [sighting] = scene.judge(HostStallDetector(), params)
    assert isinstance(sighting, Onset)
    f = sighting.finding
    assert (f.kind, f.onset, f.suspects, f.hardware) == ("host_stall", T0 + 60.0, ("n1", "n2"), False)
    longer = HostStallDetectorParams(HostStallParams(for_s=35.0), HangParams())
    assert scene.judge(HostStallDetector(), longer) == []


def test_the_straggler_detector_alone_names_the_slow_gpu_and_attributes_it_when_due() -> None:
    scene = Scene()
    scene.run_for(60.0, "compute", clock=1600.0, thermal=1.0)
    [sighting] = scene.judge(StragglerDetector(), StragglerParams(for_s=30.0, report_every_s=90.0))
    assert isinstance(sighting, Persisting)
    assert (sighting.key, sighting.for_s, sighting.every_s) == (("straggler", "n2", "1"), 30.0, 90.0)
    f = sighting.finding(T0, 0)
    assert f is not None and (f.culprit_node, f.culprit_gpu, f.hardware) == ("n2", 1, True)
    assert "thermal" in f.evidence
    assert scene.judge(StragglerDetector(), StragglerParams(enabled=False)) == []
