"""Issue 35: the agents' sub-window spin condition (``gpu_health`` ``nccl_spin``), the hang judged between
cycles for the jobs whose GPUs spin, heartbeats corroborated by NVML, culprits named only on evidence."""

from __future__ import annotations

import pytest

from tests.detect.test_detect_hang import JOB, WS, heartbeat, window
from watchd.detect.correlator import Correlator
from watchd.detect.finding import Finding
from watchd.gpu.health import HealthDeriver
from watchd.gpu.model import GpuIdentity, GpuSample
from watchd.jobs.model import JobInfo
from watchd.jobs.topology import JobTopology
from watchd.model.events import Event, Scalar, stable_id

NODES = ("n1", "n2")
GPUS = 4
T0 = 1000.0
GPU = GpuIdentity(index=0, uuid="GPU-0", pci_bus_id="00000000:18:00.0", model="NVIDIA H100 80GB HBM3")
# per-sample levels: util, power (W), NVLink+PCIe bytes/s
TRAIN = (97.0, 560.0, 1.2e11)
SPIN = (100.0, 245.0, 2e5)
COPY = (100.0, 380.0, 2e9)  # memory-bound copy: 0.68 of the matmul's power (measured on an H200)


def gpu_sample(t: float, level: tuple[float, float, float]) -> GpuSample:
    util, power, link = level
    return GpuSample(
        time=t,
        gpu=GPU,
        util_gpu=util,
        power_w=power,
        nvlink_tx_bytes_per_s=link * 0.45,
        nvlink_rx_bytes_per_s=link * 0.45,
        pcie_tx_bytes_per_s=link * 0.05,
        pcie_rx_bytes_per_s=link * 0.05,
    )


def spins(deriver: HealthDeriver, start: float, levels: list[tuple[float, float, float]]) -> list[Event]:
    out = []
    for i, level in enumerate(levels):
        out += [e for e in deriver.observe(gpu_sample(start + 2.0 * i, level), "n1")]
    return [e for e in out if e.attrs["condition"] == "nccl_spin"]


# --------------------------------------------------------------------------- the agent's condition


def test_the_agent_reports_a_spin_at_its_second_sample_with_its_first_as_since() -> None:
    d = HealthDeriver()
    events = spins(d, T0, [TRAIN] * 12 + [SPIN] * 20 + [TRAIN])
    start = T0 + 24.0  # the first spinning sample
    assert [(e.time, e.attrs["value"] != 0) for e in events] == [
        (start + 2.0, True),  # two in a row
        (start + 32.0, True),  # re-reported every 30 s while it holds
        (start + 40.0, False),  # cleared at the first sample that does not spin
    ]
    first = events[0]
    assert first.attrs["since"] == start
    assert first.attrs["value"] == pytest.approx(245.0 / 560.0, abs=0.01)
    assert first.attrs["threshold"] == 0.6 and "power 245 W" in str(first.attrs["evidence"])


def test_no_spin_before_the_baseline_is_known_nor_for_a_memory_bound_copy_or_one_sample() -> None:
    d = HealthDeriver()
    assert spins(d, T0, [TRAIN] * 5 + [SPIN] * 10) == []  # 5 computing samples: no baseline yet
    d = HealthDeriver()
    assert spins(d, T0, [TRAIN] * 12 + [COPY] * 30 + [TRAIN] * 3 + [SPIN, TRAIN] * 5) == []


def test_a_spin_never_lowers_the_baseline() -> None:
    d = HealthDeriver()
    events = spins(d, T0, [TRAIN] * 12 + [SPIN] * 200)  # 400 s of spin
    assert [e.attrs["value"] != 0 for e in events] == [True] * len(events) and len(events) >= 13


# --------------------------------------------------------------------------- the engine


def spin(node: str, gpu: int, t: float, since: float, value: float = 0.44) -> Event:
    attrs: dict[str, Scalar] = {"condition": "nccl_spin", "gpu": gpu, "value": value, "since": since}
    return Event(stable_id(node, "gpu_health", "nccl_spin", gpu, t), node, "nvml", "gpu_health", t, attrs)


def ib_down(node: str, t: float) -> Event:
    attrs: dict[str, Scalar] = {"condition": "port_down", "device": "mlx5_0", "port": 1, "value": 1}
    return Event(stable_id(node, "ib", t), node, "ib-sysfs", "ib_port_health", t, attrs)


class Job:
    """A 2 x 4 GPU job: a window per GPU every 5 s (at multiples of 5 s), the cycle every 5 s, the watch
    between cycles every second, as the engine runs them."""

    def __init__(self) -> None:
        self.c = Correlator()
        self.c.topology.replace("slurm", [JobInfo(JOB, NODES, "slurm", partition="gpu")])
        self.t = T0
        self.findings: list[Finding] = []
        self.states: dict[tuple[str, int], str] = {}
        self.pending: list[Event] = []

    def gpu_keys(self) -> list[tuple[str, int]]:
        return [(n, g) for n in NODES for g in range(GPUS)]

    def tick(self) -> None:
        """One second: the events due, then a window of every GPU at a multiple of 5 s, then a cycle or a
        watch."""
        self.t += 1.0
        due = [e for e in self.pending if e.time <= self.t]
        self.pending = [e for e in self.pending if e.time > self.t]
        for e in due:
            self.c.observe(e)
        if round(self.t) % WS == 0:
            for key in self.gpu_keys():
                self.c.observe(window(key[0], key[1], self.t, self.states.get(key, "compute")))
            self.findings += self.c.run(self.t)
        else:
            self.findings += self.c.run_watched(self.t)

    def run(self, seconds: float) -> None:
        for _ in range(round(seconds)):
            self.tick()

    def hang_at(self, onset: float, odd: tuple[str, int] | None, markers: bool = True) -> None:
        """From ``onset``: every GPU but ``odd`` spins (its agent reports it 2 s later), ``odd`` computes."""
        for key in self.gpu_keys():
            if key == odd:
                continue
            self.states[key] = "spin"
            if markers:
                self.pending.append(spin(key[0], key[1], onset + 2.0, onset))


def warmed() -> Job:
    job = Job()
    job.run(60.0)
    assert job.findings == []
    return job


def test_between_cycles_the_hang_is_found_for_s_after_the_spin_began_and_the_culprit_once_it_shows() -> None:
    job = warmed()
    onset = job.t + 0.5  # T0 + 60.5: inside the window that ends at 65
    job.hang_at(onset, ("n2", 1))
    job.run(20.0)
    first, *rest = job.findings
    assert first.kind == "nccl_hang" and first.onset == onset
    for_s = job.c.config.hang.for_s
    assert onset + for_s <= first.time < onset + for_s + 1.0  # the first watch after for_s of spin
    assert first.signal == "nvml"
    # the culprit computing: named as soon as one of its windows lies after the onset, never another node
    named = [f for f in job.findings if f.culprit_node is not None]
    assert named and {(f.culprit_node, f.culprit_gpu) for f in named} == {("n2", 1)}
    assert named[0].evidence == "odd_one_out" and named[0].time - onset <= 15.0
    assert len(rest) <= 1


def test_only_in_cycles_without_the_agents_markers() -> None:
    job = warmed()
    job.hang_at(job.t + 0.5, ("n2", 1), markers=False)
    job.run(30.0)
    assert job.findings and all(round(f.time) % WS == 0 for f in job.findings)


def test_a_spin_that_clears_before_for_s_is_nothing() -> None:
    job = warmed()
    onset = job.t + 0.5
    for key in job.gpu_keys():
        job.pending.append(spin(key[0], key[1], onset + 2.0, onset))
        job.pending.append(spin(key[0], key[1], onset + 8.0, onset, value=0))  # a barrier of 7 s
    job.run(60.0)
    assert job.findings == []
    assert not job.c.fleet.spinning


def test_a_spin_report_a_later_window_contradicts_is_not_believed() -> None:
    job = warmed()
    onset = job.t + 0.5
    for key in job.gpu_keys():
        job.pending.append(spin(key[0], key[1], onset + 2.0, onset))  # its clear never arrives
    job.run(60.0)  # the windows keep saying "computing"
    assert job.findings == []


def test_every_gpu_spinning_names_nobody_and_says_why_until_a_port_goes_down() -> None:
    job = warmed()
    onset = job.t + 0.5
    job.hang_at(onset, None)
    job.run(15.0)
    [first] = job.findings
    assert (first.culprit_node, first.evidence) == (None, "none")
    assert "every GPU spins" in str(first.extra["detail"])
    job.pending.append(ib_down("n2", job.t + 0.5))
    job.run(3.0)
    [named] = job.findings[1:]
    assert (named.culprit_node, named.hardware, named.revision) == ("n2", True, 1)
    assert "port_down" in named.summary


def _heartbeats(job: Job, step: int, at: float) -> None:
    for key in job.gpu_keys():
        rank = NODES.index(key[0]) * GPUS + key[1]
        job.pending.append(heartbeat(key[0], key[1], rank, at, step, step))


def test_heartbeats_with_spinning_gpus_find_the_hang_within_seconds() -> None:
    job = Job()
    for i in range(30):  # two steps per 2 s report
        _heartbeats(job, 2 * (i + 1), T0 + 2.0 * i + 0.5)
    job.run(60.0)
    assert job.findings == []
    onset = T0 + 60.2  # the last report was at T0 + 58.5; blocked ranks report nothing after
    job.hang_at(onset, ("n1", 2))
    job.run(10.0)
    first = job.findings[0]
    assert first.signal == "heartbeat" and first.onset == T0 + 58.5
    assert first.time - onset <= 5.0  # no step for 2 report intervals (4 s), corroborated by the spin


def test_stalled_heartbeats_while_the_gpus_compute_are_no_hang() -> None:
    # an evaluation pause the job does not declare: steps stop, the GPUs compute
    job = Job()
    for i in range(30):
        _heartbeats(job, 2 * (i + 1), T0 + 2.0 * i + 0.5)
    for i in range(30, 60):
        _heartbeats(job, 60, T0 + 2.0 * i + 0.5)
    job.run(120.0)
    assert job.findings == []


def test_a_single_job_view_is_the_view_of_the_pass() -> None:
    topo = JobTopology()
    topo.replace(
        "slurm", [JobInfo(JOB, NODES, "slurm", partition="gpu"), JobInfo("slurm:2", ("n3",), "slurm")]
    )
    for g in range(4):
        topo.observe_gpu("n1", g, JOB, T0)
    topo.observe_gpu("n2", 0, None, T0)  # no process mapping on n2: its only job's
    topo.observe_rank("n2", JOB, 3, T0)
    topo.observe_gpu("n3", 0, "slurm:2", T0)
    views = topo.jobs(T0 + 1)
    assert topo.view(JOB, T0 + 1) == views[JOB]
    assert topo.view("slurm:2", T0 + 1) == views["slurm:2"]
    assert topo.view("slurm:9", T0 + 1) is None
