"""NCCL hangs and host stalls from hand-built window sequences: the detectors and the correlator episodes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.ib.tree import ndr_node, port, write
from watchd.detect.correlator import Correlator
from watchd.detect.detector import Cycle, Onset
from watchd.detect.finding import Finding
from watchd.detect.params import DetectorsConfig
from watchd.detect.registry import DETECTORS
from watchd.ib.judge import IbJudge
from watchd.ib.reader import SysfsReader
from watchd.jobs.model import JobInfo
from watchd.model.events import Event, Scalar, stable_id

JOB = "slurm:1"
MODEL = "NVIDIA H100 80GB HBM3"
WS = 5.0
T0 = 1000.0
# util, power (W), NVLink+PCIe bytes/s: healthy training, the NCCL spin, idle
LEVELS = {"compute": (97.0, 560.0, 1.2e11), "spin": (100.0, 245.0, 2e5), "idle": (0.0, 90.0, 1e4)}


def pci(gpu: int) -> str:
    return f"0000:{0x18 + gpu * 0x10:02x}:00.0"


def window(node: str, gpu: int, t: float, state: str = "compute", job: str | None = JOB) -> Event:
    util, power, link = LEVELS[state]
    attrs: dict[str, Scalar] = {
        "gpu": gpu,
        "pci_bus_id": pci(gpu),
        "model": MODEL,
        "window_s": WS,
        "util_mean": util,
        "power_mean": power,
        "sm_clock_mean": 1980.0 if state != "idle" else 345.0,
        "nvlink_tx_mean": link * 0.45,
        "nvlink_rx_mean": link * 0.45,
        "pcie_tx_mean": link * 0.05,
        "pcie_rx_mean": link * 0.05,
        "hw_slowdown_frac": 0.0,
        "thermal_frac": 0.0,
        "power_brake_frac": 0.0,
    }
    if job is not None:
        attrs["job"] = job
    return Event(stable_id(node, "gpu_summary", gpu, t), node, "nvml", "gpu_summary", t, attrs)


def xid(node: str, gpu: int, t: float, number: int, bucket: str) -> Event:
    attrs: dict[str, Scalar] = {
        "xid": number,
        "bucket": bucket,
        "pci_bus_id": pci(gpu),
        "message": f"Xid {number}",
    }
    return Event(stable_id(node, "xid", number, t), node, "kmsg", "xid", t, attrs)


def health(node: str, gpu: int, t: float, condition: str, value: int = 1) -> Event:
    attrs: dict[str, Scalar] = {"condition": condition, "gpu": gpu, "value": value, "evidence": condition}
    return Event(stable_id(node, "gpu_health", condition, t), node, "nvml", "gpu_health", t, attrs)


def heartbeat(
    node: str,
    gpu: int,
    rank: int,
    t: float,
    step: int,
    seq: int,
    phase: str = "train",
    step_time: float = 1.0,
) -> Event:
    attrs: dict[str, Scalar] = {
        "job": JOB,
        "rank": rank,
        "gpu": gpu,
        "step": step,
        "step_time_s": step_time,
        "compute_time_s": 0.7 * step_time,
        "collective_seq": seq,
        "phase": phase,
    }
    return Event(stable_id(node, "heartbeat", rank, t), node, "heartbeat", "heartbeat", t, attrs)


Key = tuple[str, int]


class Job:
    """One job on ``nodes`` x ``gpus`` GPUs, a window per GPU every 5 s, a detector cycle after each."""

    def __init__(
        self,
        nodes: tuple[str, ...] = ("n1", "n2"),
        gpus: int = 4,
        config: DetectorsConfig | None = None,
        partition: str = "gpu",
        scheduler: bool = True,
        process_mapping: bool = True,
    ) -> None:
        self.nodes = nodes
        self.gpus = gpus
        self.partition = partition
        self.c = Correlator(config)
        if scheduler:
            self.c.topology.replace("slurm", [JobInfo(JOB, nodes, "slurm", partition=partition)])
        self.window_job = JOB if process_mapping else None
        self.t = T0
        self.findings: list[Finding] = []

    def members(self) -> list[Key]:
        return [(n, g) for n in self.nodes for g in range(self.gpus)]

    def rank(self, key: Key) -> int:
        return self.nodes.index(key[0]) * self.gpus + key[1]

    def step(self, default: str | None, overrides: Mapping[Key, str | None] | None = None) -> list[Finding]:
        """Advance 5 s: every GPU in state ``default`` (None: no window) unless overridden; run a cycle."""
        self.t += WS
        chosen = overrides or {}
        for key in self.members():
            state = chosen.get(key, default)
            if state is not None:
                self.c.observe(window(key[0], key[1], self.t, state, job=self.window_job))
        out = self.c.run(self.t)
        self.findings += out
        return out

    def run_for(
        self, seconds: float, default: str | None, overrides: Mapping[Key, str | None] | None = None
    ) -> list[Finding]:
        out: list[Finding] = []
        for _ in range(round(seconds / WS)):
            out += self.step(default, overrides)
        return out

    def observe(self, event: Event) -> None:
        self.c.observe(event)

    def condition(self, now: float | None = None) -> Finding | None:
        """The job's condition at ``now`` as the detectors judge it (the first that sees one), reported or
        not."""
        now = self.t if now is None else now
        view = self.c.topology.jobs(now)[JOB]
        cycle = Cycle(self.c.fleet, now, self.c.config)
        params = self.c.config.for_partition(view.partition)
        for detector in DETECTORS:
            for sighting in detector.judge(cycle, view, detector.params(params)):
                assert isinstance(sighting, Onset)
                return sighting.finding
        return None


def warmed(job: Job | None = None, seconds: float = 60.0) -> Job:
    job = job or Job()
    assert job.run_for(seconds, "compute") == []
    return job


def hangs(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.kind == "nccl_hang"]


# --------------------------------------------------------------------------- healthy, threshold


def test_healthy_job_gives_nothing() -> None:
    job = warmed(seconds=600.0)
    assert job.findings == []
    assert job.condition() is None


def test_spin_on_every_gpu_for_for_s_is_a_hang_and_not_one_window_earlier() -> None:
    job = warmed()  # t = 1060: the spin starts with the next window
    onset = job.t
    for_s = job.c.config.hang.for_s
    assert for_s == 10.0
    assert job.run_for(for_s - WS, "spin") == []  # 5 s of spin
    assert job.condition() is None
    [f] = job.step("spin")  # 10 s
    assert f.kind == "nccl_hang"
    assert f.onset == onset
    assert f.time == onset + for_s
    assert f.signal == "nvml"
    assert f.extra["gpus"] == 8 and f.extra["gpus_matching"] == 8
    assert f.revision == 0


def test_spin_on_fewer_than_the_fraction_is_no_hang() -> None:
    job = warmed()
    spinning = {k: "spin" for k in job.members()[:3]}  # 3 of 8 spin, the rest compute
    job.run_for(120.0, "compute", spinning)
    assert job.findings == []


def test_spin_on_most_gpus_is_a_hang() -> None:
    job = warmed()
    computing: dict[Key, str | None] = {("n1", 0): "compute", ("n2", 0): "compute", ("n2", 1): "compute"}
    job.run_for(20.0, "spin", computing)  # 5 of 8 spin
    assert [f.kind for f in job.findings] == ["nccl_hang"]


# --------------------------------------------------------------------------- culprit evidence order


def test_hardware_xid_beats_the_odd_one_out() -> None:
    job = warmed()
    job.observe(xid("n2", 1, job.t + 2.0, 79, "RESTART_BM"))
    job.run_for(20.0, "spin", {("n1", 2): "compute"})  # n1 GPU 2 is the odd one out, n2 had the Xid
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu) == ("n2", 1)  # the Xid's PCI address maps to GPU 1
    assert f.evidence == "gpu_lost"
    assert f.hardware is True
    assert f.confidence == pytest.approx(0.95)


def test_gpu_lost_health_event_names_the_node_and_gpu() -> None:
    job = warmed()
    job.observe(health("n2", 1, job.t + 1.0, "gpu_lost"))
    job.run_for(20.0, "spin", {("n2", 1): None, ("n1", 2): "compute"})  # the lost GPU sends no windows
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu, f.evidence, f.hardware) == ("n2", 1, "gpu_lost", True)


@pytest.mark.parametrize(
    "event",
    [
        xid("n2", 3, T0 + 61.0, 74, "WORKFLOW_NVLINK_ERR"),
        health("n2", 3, T0 + 61.0, "nvlink_down"),
    ],
    ids=["xid74", "gpu_health"],
)
def test_nvlink_down_is_hardware_evidence(event: Event) -> None:
    job = warmed()
    job.observe(event)
    job.run_for(20.0, "spin")
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu, f.evidence, f.hardware) == ("n2", 3, "nvlink_down", True)


class IbNode:
    """A node's InfiniBand ports as the agent reads and judges them (a real tree, tests/ib/tree.py)."""

    def __init__(self, node: str, tmp: Path) -> None:
        self.root = ndr_node(tmp / node, 8)
        self.reader = SysfsReader(self.root)
        self.judge = IbJudge(node)

    def scan(self, t: float) -> list[Event]:
        return self.judge.observe(self.reader.scan(t))


def test_a_node_that_lost_its_infiniband_link_is_the_hangs_culprit(tmp_path: Path) -> None:
    job = warmed()
    ib = IbNode("n2", tmp_path)
    assert ib.scan(T0) == []
    write(port(ib.root, "mlx5_5") / "state", "1: DOWN")
    write(port(ib.root, "mlx5_5") / "phys_state", "3: Disabled")
    for event in ib.scan(job.t + 3.0):
        job.observe(event)
    job.run_for(20.0, "spin", {("n1", 2): "compute"})  # it also beats an odd one out on the other node
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu, f.evidence, f.hardware) == ("n2", None, "hardware_event", True)
    assert f.extra["detail"] == "ib port_down: mlx5_5:1 DOWN (physical Disabled), was ACTIVE at 400 Gb/sec"
    assert f.confidence == pytest.approx(0.95)


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        (("rate", "200 Gb/sec (2X NDR)"), "ib rate_downtrained: mlx5_0:1 at 200 Gb/sec (2X NDR), below 400"),
        (("counters/link_downed", "3"), "ib link_errors: mlx5_0:1 link_downed +3 in 300s"),
    ],
    ids=["downtrained", "link_downed"],
)
def test_a_downtrained_or_flapping_link_is_hardware_evidence(
    tmp_path: Path, change: tuple[str, str], detail: str
) -> None:
    job = warmed()
    ib = IbNode("n1", tmp_path)
    ib.scan(T0)
    write(port(ib.root, "mlx5_0") / change[0], change[1])
    for event in ib.scan(job.t - 14.0) + ib.scan(job.t + 1.0):  # a downtrain needs two scans
        job.observe(event)
    job.run_for(20.0, "spin")
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.hardware) == ("n1", True)
    assert str(f.extra["detail"]).startswith(detail)


def test_a_cleared_port_and_a_transport_counter_are_no_evidence(tmp_path: Path) -> None:
    job = warmed()
    ib = IbNode("n2", tmp_path)
    ib.judge.params = dataclasses.replace(ib.judge.params, error_thresholds={"out_of_sequence": 1})
    ib.reader = SysfsReader(ib.root, hw_counters=["out_of_sequence"])
    ib.scan(T0)
    write(port(ib.root, "mlx5_1") / "state", "1: DOWN")
    write(port(ib.root, "mlx5_1") / "hw_counters" / "out_of_sequence", "50")
    events = ib.scan(T0 + 30.0)
    assert sorted(e.attrs["condition"] for e in events) == ["link_errors", "port_down"]
    write(port(ib.root, "mlx5_1") / "state", "4: ACTIVE")
    events += ib.scan(T0 + 45.0)  # the port came back: its clear
    for event in events:
        if event.attrs["condition"] == "port_down" and event.attrs["value"] == 1:
            continue  # the start, long before the onset; only its clear and the transport counter remain
        job.observe(event)
    job.run_for(20.0, "spin", {("n1", 2): "compute"})
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.evidence, f.hardware) == ("n1", "odd_one_out", False)


def test_hardware_event_beats_an_application_xid() -> None:
    job = warmed()
    job.observe(xid("n1", 0, job.t + 1.0, 13, "RESTART_APP"))
    job.observe(health("n2", 2, job.t + 2.0, "ecc_dbe"))
    job.run_for(20.0, "spin")
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu, f.evidence, f.hardware) == ("n2", 2, "hardware_event", True)


def test_application_xid_names_the_node_without_hardware() -> None:
    job = warmed()
    job.observe(xid("n2", 0, job.t + 1.0, 13, "RESTART_APP"))
    job.run_for(20.0, "spin", {("n1", 2): "compute"})  # it also beats an odd one out elsewhere
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu) == ("n2", 0)
    assert f.evidence == "app_xid"
    assert f.hardware is False


def test_informational_xid_is_no_evidence() -> None:
    job = warmed()
    job.observe(xid("n2", 0, job.t + 1.0, 63, "IGNORE"))
    job.run_for(20.0, "spin")
    [f] = hangs(job.findings)
    assert f.culprit_node is None and f.evidence == "none"


def test_hardware_event_long_before_the_onset_does_not_count() -> None:
    job = warmed()
    lookback = job.c.config.hang.culprit_lookback_s
    job.observe(xid("n2", 1, job.t - lookback - 5.0, 79, "RESTART_BM"))  # onset is job.t
    job.run_for(20.0, "spin")
    [f] = hangs(job.findings)
    assert f.culprit_node is None
    assert f.hardware is False


def test_odd_gpu_out_is_named_with_its_gpu() -> None:
    job = warmed()
    job.run_for(20.0, "spin", {("n1", 2): "compute"})
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu) == ("n1", 2)
    assert f.evidence == "odd_one_out"
    assert f.hardware is False
    assert f.suspects == ("n1",)


def test_silent_gpu_is_the_odd_one_out() -> None:
    job = warmed()
    job.run_for(20.0, "spin", {("n2", 3): None})
    # at for_s the GPU's last window predates the hang: not known to be odd yet, and the finding says so;
    # three windows missed (15 s), it is
    first, named = hangs(job.findings)
    assert (first.culprit_node, first.evidence) == (None, "none")
    assert (named.culprit_node, named.culprit_gpu, named.evidence) == ("n2", 3, "odd_one_out")
    assert named.revision == 1


def test_odd_gpus_on_two_nodes_give_suspects_not_a_culprit() -> None:
    job = warmed()
    job.run_for(20.0, "spin", {("n1", 2): "compute", ("n2", 0): "compute"})
    [f] = hangs(job.findings)
    assert f.culprit_node is None
    assert f.suspects == ("n1", "n2")


def test_no_culprit_lists_the_suspects() -> None:
    job = warmed()
    job.run_for(20.0, "spin")
    [f] = hangs(job.findings)
    assert f.culprit_node is None and f.culprit_gpu is None
    assert f.evidence == "none"
    assert f.hardware is False
    assert f.suspects == ("n1", "n2")
    assert f.node == "n1"
    assert "no culprit" in f.summary


def test_the_first_gpu_to_go_quiet_is_not_named() -> None:
    # The first to spin is the first to reach the collective the others wait in: the earliest to arrive,
    # not the one that failed. With every GPU spinning and nothing else known, the finding says so.
    job = warmed()
    job.step("compute", {("n2", 2): "spin"})  # n2 GPU 2 spins 5 s before the others
    job.run_for(20.0, "spin")
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu, f.evidence) == (None, None, "none")
    assert "every GPU spins" in str(f.extra["detail"])
    assert f.onset == T0 + 60.0


# --------------------------------------------------------------------------- warm-up, shrink, recovery


@pytest.mark.parametrize(("computed_s", "judged"), [(20.0, False), (25.0, False), (30.0, True)])
def test_a_job_is_judged_only_after_warmup(computed_s: float, judged: bool) -> None:
    job = Job()
    job.run_for(computed_s, "compute")
    job.run_for(60.0, "spin")
    assert bool(hangs(job.findings)) is judged


def test_a_job_that_never_computed_is_not_judged() -> None:
    job = Job()
    job.run_for(300.0, "idle")  # loading for 5 minutes: no host stall either
    assert job.findings == []
    assert job.condition() is None


def test_job_shrinking_mid_hang_is_judged_on_the_remaining_members() -> None:
    nodes = ("n1", "n2", "n3", "n4", "n5")
    job = warmed(Job(nodes))
    gone: dict[Key, str | None] = {(n, g): None for n in nodes[2:] for g in range(4)}
    job.run_for(20.0, "spin", gone)  # n1, n2 spin (8 of 20 GPUs); n3-n5 fell silent
    assert job.findings == []
    job.c.topology.replace("slurm", [JobInfo(JOB, nodes[:2], "slurm", partition="gpu")])
    [f] = job.step("spin", gone)
    assert f.kind == "nccl_hang"
    assert f.extra["gpus"] == 8
    assert set(f.suspects) <= {"n1", "n2"}


def test_gpus_that_recover_before_for_s_give_nothing() -> None:
    job = warmed()
    for_s = job.c.config.hang.for_s
    for _ in range(5):  # spin one window short of for_s, compute 10 s, again and again
        job.run_for(for_s - WS, "spin")
        job.run_for(10.0, "compute")
    assert job.findings == []


def test_one_gpu_recovering_before_for_s_leaves_too_few_spinning() -> None:
    job = warmed()
    job.run_for(5.0, "compute", {k: "spin" for k in job.members()[:4]})  # 4 of 8: exactly the fraction
    job.run_for(60.0, "compute", {k: "spin" for k in job.members()[:3]})  # one recovered: 3 of 8
    assert job.findings == []


# --------------------------------------------------------------------------- host stall, quiet phases


def test_host_stall_after_for_s_of_all_idle() -> None:
    job = warmed()
    since = job.t
    for_s = job.c.config.host_stall.for_s
    assert job.run_for(for_s - WS, "idle") == []
    [f] = job.step("idle")
    assert f.kind == "host_stall"
    assert f.onset == since and f.time == since + for_s
    assert f.hardware is False and f.culprit_node is None
    assert f.suspects == ("n1", "n2")
    assert job.run_for(60.0, "idle") == []  # reported once


def test_one_gpu_still_computing_is_no_host_stall() -> None:
    job = warmed()
    job.run_for(300.0, "idle", {("n1", 0): "compute"})  # 7 of 8 idle: below the 0.9 fraction
    assert job.findings == []


def _hb_all(job: Job, t: float, step: int, phase: str = "train", lag: Key | None = None) -> None:
    for key in job.members():
        seq = step if key == lag else step + 1 if lag is not None else step
        job.observe(heartbeat(key[0], key[1], job.rank(key), t, step, seq, phase))


@pytest.mark.parametrize("state", ["spin", "idle"])
def test_declared_quiet_phase_suppresses_hang_and_host_stall(state: str) -> None:
    job = Job()
    for i in range(12):  # warm up with heartbeats
        job.step("compute")
        _hb_all(job, job.t, 5 * (i + 1))
    for _ in range(40):  # 200 s of spin / idle while the job says it checkpoints
        job.step(state)
        _hb_all(job, job.t, 60, phase="checkpoint")
    assert job.findings == []


def test_the_end_of_a_long_quiet_phase_is_not_a_stall() -> None:
    # The client reports the phase once as it starts and once as it ends (phase train, step unchanged);
    # the next step reaches the engine a forward interval later.
    job = Job()
    for i in range(12):
        job.step("compute")
        _hb_all(job, job.t, i + 1)
    _hb_all(job, job.t, 12, phase="checkpoint")
    job.run_for(30.0, "compute")  # 30 s of checkpoint, longer than the stall threshold, no reports
    _hb_all(job, job.t, 12)  # back to training, no step finished yet
    job.step("compute")
    assert job.condition() is None
    _hb_all(job, job.t, 13)
    job.run_for(5.0, "compute")  # the first step after it finished; the stall threshold is 10 s
    assert job.findings == []
    job.run_for(5.0, "spin")  # then steps really stop, the GPUs spin: a hang again (before NVML's for_s)
    assert [(f.kind, f.signal) for f in job.findings] == [("nccl_hang", "heartbeat")]


def test_a_stale_quiet_declaration_does_not_hide_a_hang_after_it() -> None:
    job = Job()
    for i in range(12):
        job.step("compute")
        _hb_all(job, job.t, 5 * (i + 1))
    for _ in range(4):  # a 20 s checkpoint
        job.step("idle")
        _hb_all(job, job.t, 60, phase="checkpoint")
    for _ in range(24):  # the first collective after it hangs: blocked ranks send no heartbeat
        job.step("spin")
        job.c.prune(job.t)
    assert [f.kind for f in job.findings] == ["nccl_hang"]  # within 120 s of the spin


@pytest.mark.parametrize("state", ["spin", "idle"])
def test_without_a_quiet_phase_the_same_windows_are_found(state: str) -> None:
    job = Job()
    for i in range(12):
        job.step("compute")
        _hb_all(job, job.t, 5 * (i + 1))
    for _ in range(40):
        job.step(state)
        _hb_all(job, job.t, 60)
    assert [f.kind for f in job.findings] == ["nccl_hang" if state == "spin" else "host_stall"]


@pytest.mark.parametrize(("step_time", "stall_after"), [(1.0, 10.0), (4.0, 20.0)])
def test_heartbeat_hang_names_the_rank_whose_collective_lags(step_time: float, stall_after: float) -> None:
    # Heartbeats alone (no NVML windows): no step for max(min_stall_s, step_factor x median step).
    job = Job()
    for i in range(12):
        job.step(None)
        for key in job.members():
            job.observe(
                heartbeat(key[0], key[1], job.rank(key), job.t, i + 1, 10 * (i + 1), step_time=step_time)
            )
    last_advance = job.t  # steps stop advancing here; the GPUs still look busy to NVML
    lagging: Key = ("n2", 1)
    while job.t < last_advance + stall_after:
        job.step(None)
        for key in job.members():
            seq = 120 if key == lagging else 121
            job.observe(heartbeat(key[0], key[1], job.rank(key), job.t, 12, seq, step_time=step_time))
        if job.t < last_advance + stall_after:
            assert job.findings == []
    assert job.condition(last_advance + stall_after - 0.1) is None
    [f] = job.findings
    assert f.kind == "nccl_hang"
    assert f.time == last_advance + stall_after
    assert f.signal == "heartbeat"
    assert f.onset == last_advance
    assert (f.culprit_node, f.culprit_gpu) == lagging
    assert f.evidence == "heartbeat_lag"
    assert f.hardware is False
    assert "rank 5" in f.summary


def test_heartbeats_alone_place_the_job_without_scheduler_or_process_mapping() -> None:
    job = Job(scheduler=False, process_mapping=False)  # the windows carry no job: only the ranks name it
    for i in range(12):
        job.step("compute")
        _hb_all(job, job.t, i + 1)
    assert job.c.topology.jobs(job.t)[JOB].gpus == {"n1": (0, 1, 2, 3), "n2": (0, 1, 2, 3)}
    for _ in range(4):
        job.step("spin")  # steps stop and the GPUs spin
        _hb_all(job, job.t, 12, lag=("n1", 2))
    [f] = hangs(job.findings)
    assert (f.culprit_node, f.culprit_gpu, f.evidence) == ("n1", 2, "heartbeat_lag")


def test_heartbeat_stall_with_all_gpus_idle_is_not_a_hang() -> None:
    job = Job()
    for i in range(12):
        job.step("compute")
        _hb_all(job, job.t, i + 1)
    for _ in range(40):
        job.step("idle")
        _hb_all(job, job.t, 12)  # steps stopped, the GPUs went idle: a host stall, not a hang
    assert [f.kind for f in job.findings] == ["host_stall"]


def test_heartbeats_find_the_hang_before_nvml_and_both_signals_agree_later() -> None:
    job = Job()
    for i in range(12):  # ranks report every 2.5 s
        job.step("compute")
        _hb_all(job, job.t - 2.5, 2 * i + 1)
        _hb_all(job, job.t, 2 * i + 2)
    stopped = job.t
    for _ in range(4):
        job.step("spin")
        _hb_all(job, job.t, 24, lag=("n1", 3))
    # the heartbeat signal while the GPUs spin: no step for 2 reporting intervals (5 s); NVML needs 10 s.
    # The lagging collective is reported after that cycle: the culprit follows in a revision.
    f, named = job.findings
    assert f.time == stopped + 5.0
    assert f.signal == "heartbeat"
    assert f.culprit_node is None
    assert (named.culprit_node, named.culprit_gpu, named.evidence) == ("n1", 3, "heartbeat_lag")
    v = job.condition()  # at 20 s of spin
    assert v is not None and v.kind == "nccl_hang" and v.signal == "nvml+heartbeat"


# --------------------------------------------------------------------------- correlator episodes


def test_a_hang_is_reported_once_per_episode() -> None:
    job = warmed()
    job.run_for(300.0, "spin")
    assert len(job.findings) == 1


def test_revision_when_hardware_evidence_arrives_later() -> None:
    job = warmed()
    job.run_for(30.0, "spin")
    [first] = job.findings
    assert first.culprit_node is None and first.revision == 0
    job.observe(xid("n2", 1, job.t + 1.0, 79, "RESTART_BM"))
    job.run_for(60.0, "spin")
    assert len(job.findings) == 2
    second = job.findings[1]
    assert second.revision == 1
    assert (second.culprit_node, second.culprit_gpu, second.hardware) == ("n2", 1, True)
    assert second.onset == first.onset


def test_revisions_climb_from_odd_one_out_to_hardware_but_never_back() -> None:
    job = warmed()
    job.run_for(20.0, "spin")  # no culprit
    job.run_for(20.0, "spin", {("n1", 2): None})  # n1 GPU 2 goes silent: the odd one out
    job.observe(health("n1", 2, job.t, "gpu_lost"))
    job.run_for(20.0, "spin", {("n1", 2): None})
    job.run_for(20.0, "spin")  # it comes back: a weaker culprit is no revision
    assert [(f.revision, f.evidence, f.culprit_node) for f in job.findings] == [
        (0, "none", None),
        (1, "odd_one_out", "n1"),
        (2, "gpu_lost", "n1"),
    ]


def test_a_recurrence_within_clear_after_s_is_the_same_episode() -> None:
    job = warmed()
    job.run_for(40.0, "spin")
    job.run_for(10.0, "compute")
    job.run_for(40.0, "spin")
    assert len(job.findings) == 1


def test_a_new_finding_after_the_condition_cleared_for_clear_after_s() -> None:
    job = warmed()
    job.run_for(40.0, "spin")
    job.run_for(60.0, "compute")
    second_onset = job.t
    job.run_for(40.0, "spin")
    assert len(job.findings) == 2
    assert job.findings[1].onset == second_onset
    assert job.findings[1].revision == 0


# --------------------------------------------------------------------------- Finding.to_event


def test_finding_event_with_a_culprit() -> None:
    f = Finding(
        kind="nccl_hang",
        job=JOB,
        time=1100.0,
        onset=1062.46,
        summary="job slurm:1 hangs",
        confidence=0.95123,
        evidence="gpu_lost",
        hardware=True,
        culprit_node="n2",
        culprit_gpu=1,
        suspects=("n2",),
        partition="gpu",
        signal="nvml",
        extra={"gpus": 8},
    )
    e = f.to_event()
    assert (e.kind, e.source, e.node, e.time) == ("nccl_hang", "detector", "n2", 1100.0)
    a = e.attrs
    assert a["job"] == JOB
    assert a["culprit_node"] == "n2"
    assert a["culprit_gpu"] == 1 and a["gpu"] == 1
    assert a["hardware"] is True
    assert a["evidence"] == "gpu_lost"
    assert a["duration_s"] == 37.5
    assert a["confidence"] == 0.951
    assert a["partition"] == "gpu"
    assert a["suspects"] == "n2"
    assert a["gpus"] == 8
    assert e.id == f.to_event().id  # stable
    assert e.id != dataclasses.replace(f, time=1105.0).to_event().id


def test_finding_event_without_a_culprit_is_on_the_first_suspect() -> None:
    f = Finding("host_stall", JOB, 1200.0, 1250.0, "stall", 0.6, suspects=("n3", "n4"))
    e = f.to_event()
    assert e.node == "n3"
    assert "culprit_node" not in e.attrs and "culprit_gpu" not in e.attrs and "gpu" not in e.attrs
    assert "partition" not in e.attrs
    assert e.attrs["suspects"] == "n3,n4"
    assert e.attrs["duration_s"] == 0.0  # never negative
    assert e.attrs["hardware"] is False
    assert Finding("host_stall", JOB, 1.0, 0.0, "s", 0.5).node == "-"


def test_finding_from_the_detector_converts_to_an_event() -> None:
    job = warmed()
    job.run_for(20.0, "spin", {("n1", 2): "compute"})
    [f] = job.findings
    e = f.to_event()
    assert e.node == "n1"
    assert e.attrs["culprit_gpu"] == 2
    assert e.attrs["duration_s"] == job.c.config.hang.for_s
    assert e.attrs["gpus"] == 8
