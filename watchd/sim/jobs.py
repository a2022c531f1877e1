"""Simulated jobs at the level the engine sees them: per-GPU window summaries, hardware events and
forwarded heartbeats, for the detector tests and the evaluation suite (``benchmarks/detection.py``).

The signal levels follow the fake GPU backend (:mod:`watchd.sim.gpu`): healthy training at 0.7-0.9 of TDP
with per-GPU offsets, the NCCL spin at ~0.35 of TDP with no link traffic, idle at ~0.13. Healthy runs carry
realistic noise: per-GPU silicon offsets, communication-heavy phases (power down, links busy), one-window
dips of one GPU, lost windows, and step-time jitter.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from watchd.model.events import Event, Scalar, stable_id

Fault = Literal[
    "none",
    "hang_compute",  # one rank stuck in compute, the others spin
    "hang_lost",  # one GPU falls off the bus, the others spin
    "hang_nvlink",  # one GPU's NVLink goes down, every rank spins
    "hang_nic",  # one node's NIC fails (NET/IB completion errors): every rank spins, no Xid
    "host_stall",  # every rank idle at once (data loader, storage)
    "thermal",  # one GPU throttles (thermal): clock 0.7x
    "power_brake",  # one GPU power-braked: clock 0.35x
    "node_power_brake",  # every GPU of one node power-braked (a PSU or BMC cap): clock 0.6x
    "weak_gpu",  # one GPU clocks 15% low with no reason (below the fleet median)
    "pipeline",  # pipeline stages unequally loaded: slow but healthy
    "checkpoint",  # a pause for a checkpoint: GPUs idle for 90 s
    "transients",  # the job starts (idle, loading) and ends inside the run
    "data_loading",  # healthy: every rank waits on its data loader now and then (GPUs idle 5-25 s)
    "memcopy",  # healthy: a memory-bound phase (util 100%, ~0.67 TDP, links quiet) for 60 s
    "eval",  # healthy: an evaluation pause (forward only: util ~95%, 0.6-0.75 TDP, links quiet) for 60 s
]

_SLOW_FAULTS = frozenset({"thermal", "power_brake", "node_power_brake", "weak_gpu"})
TDP_W = 700.0
CLOCK_MHZ = 1980.0
MODEL = "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True, slots=True)
class JobRun:
    fault: Fault
    nodes: int
    gpus_per_node: int = 8
    duration_s: float = 600.0
    fault_at: float = 300.0
    fault_for_s: float | None = None  # None: until the end
    culprit: tuple[int, int] = (0, 3)  # (node index, gpu index)
    heartbeats: bool = False
    seed: int = 0
    start: float = 1_800_000_000.0
    window_s: float = 5.0
    job: str = "slurm:4242"
    node_prefix: str = "gpu"
    # the agents' sub-window spin condition (``gpu_health`` ``nccl_spin``, watchd.gpu.health): reported
    # ``spin_samples`` samples (every ``sample_s``) after a GPU starts spinning, cleared when it stops
    spin_markers: bool = True
    sample_s: float = 2.0
    spin_samples: int = 2
    # the agents' InfiniBand port reader (watchd.ib, polled every ``ib_poll_s``): in ``hang_nic`` the
    # culprit's port goes down (a NIC or link fault below the port state shows no port event: False)
    ib_events: bool = False
    ib_poll_s: float = 15.0

    def node_name(self, i: int) -> str:
        return f"{self.node_prefix}-{i:04d}"

    @property
    def culprit_node(self) -> str:
        return self.node_name(self.culprit[0])

    @property
    def nodes_list(self) -> tuple[str, ...]:
        return tuple(self.node_name(i) for i in range(self.nodes))

    def fault_active(self, t: float) -> bool:
        if self.fault in ("none", "transients", "data_loading") or t < self.fault_at:
            return False
        return self.fault_for_s is None or t < self.fault_at + self.fault_for_s

    @property
    def fault_end(self) -> float:
        return self.duration_s if self.fault_for_s is None else self.fault_at + self.fault_for_s

    def spins(self, key: tuple[int, int]) -> bool:
        """Whether GPU ``key`` spins in the NCCL kernel while the fault is on (the hang signature)."""
        if not self.fault.startswith("hang"):
            return False
        return key != self.culprit or self.fault in ("hang_nvlink", "hang_nic")


def data_stalls(run: JobRun) -> list[tuple[float, float]]:
    """``data_loading``: when every rank waits on its data loader, (start, end) in run time: one stall of
    5-25 s every 40-90 s once the job runs (input pipelines that fall behind now and then)."""
    if run.fault != "data_loading":
        return []
    rng = random.Random(run.seed * 104729 + 3)
    out = []
    t = 60.0 + rng.uniform(0.0, 30.0)
    while t < run.duration_s:
        length = rng.uniform(5.0, 25.0)
        out.append((t, t + length))
        t += length + rng.uniform(40.0, 90.0)
    return out


def _stalled_share(stalls: list[tuple[float, float]], t0: float, t1: float) -> float:
    """The share of [t0, t1) inside a data-loader stall."""
    covered = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in stalls)
    return covered / (t1 - t0)


def simulate(run: JobRun) -> Iterator[Event]:
    """Every event of the run in time order (windows at their end, heartbeats at their forwarding)."""
    return iter(sorted(_simulate(run), key=lambda e: e.time))


def _simulate(run: JobRun) -> Iterator[Event]:
    rng = random.Random(run.seed)
    stalls = data_stalls(run)
    gpus = [(n, g) for n in range(run.nodes) for g in range(run.gpus_per_node)]
    power_offset = {k: rng.uniform(-0.04, 0.04) for k in gpus}
    clock_offset = {k: rng.uniform(-0.004, 0.004) for k in gpus}
    ws = run.window_s
    step_time = 1.0
    rank_step = {k: 0 for k in gpus}
    seq = {k: 0 for k in gpus}
    next_hb = {k: rng.uniform(0.0, 2.0) for k in gpus}
    reported_phase: dict[tuple[int, int], str] = {}
    hardware_sent = False
    t = 0.0
    hb_period = 2.0
    while t < run.duration_s:
        t_next = t + ws
        # heartbeats forwarded inside this window
        if run.heartbeats:
            yield from _heartbeats(
                run,
                rng,
                gpus,
                t,
                t_next,
                next_hb,
                rank_step,
                seq,
                reported_phase,
                hb_period,
                step_time,
                stalls,
            )
        if not hardware_sent and run.fault_active(t + ws / 2) and run.fault in ("hang_lost", "hang_nvlink"):
            hardware_sent = True
            yield from _hardware_events(run, run.start + run.fault_at + 1.0)
        comm_phase = rng.random() < 0.03  # a communication-heavy phase: power down, links busy
        stalled = _stalled_share(stalls, t, t_next) if stalls else 0.0
        for key in gpus:
            w = _window(run, rng, key, t, comm_phase, power_offset[key], clock_offset[key], stalled)
            if w is not None:
                yield w
        t = t_next
    if run.spin_markers:
        yield from _spin_markers(run, gpus)
    if run.ib_events and run.fault == "hang_nic":
        yield from _ib_events(run)


_SPIN_REPORT_S = 30.0  # the health deriver's report interval: an active condition is re-sent this often


def _spin_markers(run: JobRun, gpus: list[tuple[int, int]]) -> Iterator[Event]:
    """The agents' ``nccl_spin`` condition: each node samples its GPUs every ``sample_s`` (its own phase);
    a GPU that spins from the fault's onset is reported at its ``spin_samples``-th spinning sample, with
    ``since`` its first, again every 30 s while it spins, and cleared at its first sample after."""
    if not run.fault.startswith("hang"):
        return
    phase_rng = random.Random(run.seed * 31 + 7)
    phases = [phase_rng.uniform(0.0, run.sample_s) for _ in range(run.nodes)]
    onset, end = run.fault_at, min(run.fault_end, run.duration_s)
    for key in gpus:
        if not run.spins(key):
            continue
        phase = phases[key[0]]
        first = phase + run.sample_s * math.ceil((onset - phase) / run.sample_s)
        at = first + run.sample_s * (run.spin_samples - 1)
        node = run.node_name(key[0])
        while at < end:
            yield _spin_event(run, node, key[1], at, first, 0.44)
            at += _SPIN_REPORT_S
        if end < run.duration_s:
            cleared = phase + run.sample_s * math.ceil((end - phase) / run.sample_s)
            if cleared >= first + run.sample_s * (run.spin_samples - 1):
                yield _spin_event(run, node, key[1], cleared, first, 0)


def _spin_event(run: JobRun, node: str, gpu: int, at: float, since: float, value: float) -> Event:
    pci = f"0000:{0x18 + gpu * 0x10:02x}:00.0"
    attrs: dict[str, Scalar] = {
        "condition": "nccl_spin",
        "gpu": gpu,
        "pci_bus_id": pci,
        "value": value,
        "threshold": 0.6,
        "evidence": "util 100%, power 44% of its computing baseline, links idle" if value else "spin ended",
        "since": run.start + since,
    }
    return Event(
        stable_id(node, "gpu_health", "nccl_spin", gpu, at), node, "nvml", "gpu_health", run.start + at, attrs
    )


def _ib_events(run: JobRun) -> Iterator[Event]:
    """The culprit's port seen down at the IB reader's next poll (its phase drawn per run), re-reported every
    60 s while down."""
    rng = random.Random(run.seed * 613 + 5)
    phase = rng.uniform(0.0, run.ib_poll_s)
    at = phase + run.ib_poll_s * math.ceil((run.fault_at - phase) / run.ib_poll_s)
    node = run.culprit_node
    device = f"mlx5_{run.culprit[1]}"
    while at < min(run.fault_end, run.duration_s):
        attrs: dict[str, Scalar] = {
            "condition": "port_down",
            "device": device,
            "port": 1,
            "value": 1,
            "evidence": f"{device} port 1: DOWN (Disabled), was ACTIVE",
            "link_layer": "InfiniBand",
            "state": "DOWN",
            "phys_state": "Disabled",
        }
        yield Event(
            stable_id(node, "ib_port_health", device, at),
            node,
            "ib-sysfs",
            "ib_port_health",
            run.start + at,
            attrs,
        )
        at += 60.0


def _phase(run: JobRun, t: float) -> str:
    if run.fault == "transients":
        if t < 45.0:
            return "init"
        if t >= run.duration_s - 60.0:
            return "gone" if t >= run.duration_s - 50.0 else "ending"
    if run.fault == "checkpoint" and run.fault_at <= t < run.fault_at + (run.fault_for_s or 90.0):
        return "checkpoint"
    return "train"


def _heartbeats(
    run: JobRun,
    rng: random.Random,
    gpus: list[tuple[int, int]],
    t0: float,
    t1: float,
    next_hb: dict[tuple[int, int], float],
    rank_step: dict[tuple[int, int], int],
    seq: dict[tuple[int, int], int],
    reported_phase: dict[tuple[int, int], str],
    period: float,
    step_time: float,
    stalls: list[tuple[float, float]],
) -> Iterator[Event]:
    hung = run.fault.startswith("hang") or run.fault == "host_stall"
    # the ranks that never reach the collective the others wait in: a rank stuck in compute, or whose GPU
    # was lost; after a NIC or NVLink failure every rank entered it (no rank lags)
    lagging = run.fault in ("hang_compute", "hang_lost")
    for key in gpus:
        while next_hb[key] < t1:
            at = next_hb[key]
            next_hb[key] += period
            phase = _phase(run, at)
            if phase == "gone":
                continue
            if hung and run.fault_active(at):
                continue  # blocked ranks report nothing
            if phase in ("init", "checkpoint") and reported_phase.get(key) == phase:
                continue  # as watchd.client does: a quiet phase is reported once, as it starts
            reported_phase[key] = phase
            advance = int(period / step_time)
            if (stalls and _stalled_share(stalls, at - period, at) > 0.5) or (
                run.fault == "eval" and run.fault_active(at)
            ):
                advance = 0  # waiting on data, or evaluating (the training step does not move; undeclared)
            rank_step[key] += advance if phase == "train" else 0
            seq[key] += advance if phase == "train" else 0
            rank = key[0] * run.gpus_per_node + key[1]
            compute = step_time * 0.7 * (1.0 + rng.gauss(0.0, 0.02))
            if run.fault == "pipeline":
                compute *= 1.0 - 0.1 * (key[0] * 4 // max(1, run.nodes))
            slow = key == run.culprit or (run.fault == "node_power_brake" and key[0] == run.culprit[0])
            if run.fault in _SLOW_FAULTS and slow and run.fault_active(at):
                compute *= 1.4
            attrs: dict[str, Scalar] = {
                "job": run.job,
                "rank": rank,
                "step": rank_step[key],
                "step_time_s": round(step_time * (1.0 + rng.gauss(0.0, 0.03)), 4),
                "compute_time_s": round(compute, 4),
                "collective_seq": seq[key],
                "phase": "train" if phase in ("train", "ending") else phase,
                "gpu": key[1],
                "local_rank": key[1],
                "reports": advance or 1,
            }
            if hung and run.fault_active(at + period):
                # a rank's last report before it blocks: synchronous ranks all reached the same collective
                # (the agent forwards each rank's latest state), and entered the next one unless they are
                # the rank stuck in compute or whose GPU was lost
                hang_seq = 1_000_000 + int(run.fault_at / step_time)
                attrs["collective_seq"] = hang_seq + (1 if lagging and key != run.culprit else 0)
            node = run.node_name(key[0])
            yield Event(
                stable_id(
                    node, "heartbeat", run.job, rank, rank_step[key], attrs["phase"], attrs["collective_seq"]
                ),
                node,
                "heartbeat",
                "heartbeat",
                run.start + at,
                attrs,
            )


def _hardware_events(run: JobRun, at: float) -> Iterator[Event]:
    node = run.culprit_node
    gpu = run.culprit[1]
    pci = f"0000:{0x18 + gpu * 0x10:02x}:00.0"
    if run.fault == "hang_lost":
        xid, bucket, condition = 79, "RESTART_BM", "gpu_lost"
    else:
        xid, bucket, condition = 74, "WORKFLOW_NVLINK_ERR", "nvlink_down"
    yield Event(
        stable_id(node, "xid", xid, at),
        node,
        "kmsg",
        "xid",
        at,
        {"xid": xid, "pci_bus_id": pci, "bucket": bucket, "message": f"Xid {xid}"},
    )
    yield Event(
        stable_id(node, "gpu_health", condition, at),
        node,
        "nvml",
        "gpu_health",
        at + 1.0,
        {"condition": condition, "gpu": gpu, "value": 1, "pci_bus_id": pci, "evidence": condition},
    )


def _window(
    run: JobRun,
    rng: random.Random,
    key: tuple[int, int],
    t: float,
    comm_phase: bool,
    power_offset: float,
    clock_offset: float,
    stalled: float = 0.0,
) -> Event | None:
    node_i, gpu = key
    end = t + run.window_s
    phase = _phase(run, end)
    if phase == "gone" or rng.random() < 0.005:
        return None  # the job's processes ended / a lost window
    fault_on = run.fault_active(t + run.window_s / 2)  # the fault covers most of the window
    culprit = node_i == run.culprit[0] if run.fault == "node_power_brake" else key == run.culprit
    power = TDP_W * (0.8 + power_offset + rng.gauss(0.0, 0.012))
    util = min(100.0, 97.5 + rng.uniform(-2.5, 2.5))
    clock = CLOCK_MHZ * (1.0 + clock_offset) - 15.0 * rng.uniform(0.0, 3.0) / 2
    link = 1.2e11 * rng.uniform(0.85, 1.15) + 6e9 * rng.uniform(0.8, 1.2)
    reasons = {"hw_slowdown": 0.0, "thermal": 0.0, "power_brake": 0.0}
    if comm_phase:
        power *= 0.72
        link *= 1.3
    elif rng.random() < 0.01:
        power *= 0.62  # one GPU, one window
    if phase in ("init", "ending", "checkpoint"):
        util, power, link = 0.0, TDP_W * 0.13 * rng.uniform(0.95, 1.05), rng.uniform(0.0, 1e5)
        clock = 345.0
    elif stalled > 0.0:  # waiting on the data loader for that share of the window: idle meanwhile
        util *= 1.0 - stalled
        power = power * (1.0 - stalled) + TDP_W * 0.13 * stalled
        link *= 1.0 - stalled
    elif fault_on and run.fault in ("memcopy", "eval"):
        if run.fault == "memcopy":  # measured on an H200: 470 W copying vs 692 W in a matmul, util 100%
            util, power = 100.0, power * 0.68 * rng.uniform(0.97, 1.03)
        else:  # forward passes only: compute-bound, less power than training, no gradient all-reduce
            util, power = min(100.0, 95.0 + rng.uniform(-3.0, 3.0)), power * rng.uniform(0.75, 0.9)
        link = 1.2e11 * rng.uniform(0.0, 0.02)  # device-local: NVLink/PCIe all but quiet
    elif fault_on:
        f = run.fault
        if f.startswith("hang"):
            if culprit and f == "hang_lost":
                return None  # the GPU fell off the bus: NVML has no samples for it
            if not run.spins(key):  # stuck in compute
                link = rng.uniform(0.0, 1e5)
            else:
                util = 100.0 - rng.choice((0.0, 0.0, 1.0))
                power = TDP_W * 0.35 * rng.uniform(0.95, 1.05)
                link = rng.uniform(0.0, 3e5)
        elif f == "host_stall":
            util, power, link = 0.0, TDP_W * 0.13 * rng.uniform(0.95, 1.05), rng.uniform(0.0, 1e5)
        elif f == "pipeline":
            stage = node_i * 4 // max(1, run.nodes)
            util *= 1.0 - 0.12 * stage
            power *= 1.0 - 0.1 * stage
        elif culprit and f == "thermal":
            clock *= 0.7
            power *= 0.85
            reasons["thermal"] = 1.0
        elif culprit and f == "power_brake":
            clock *= 0.35
            power *= 0.5
            reasons["power_brake"] = 1.0
            reasons["hw_slowdown"] = 1.0
        elif culprit and f == "node_power_brake":
            clock *= 0.6
            power *= 0.6
            reasons["power_brake"] = 1.0
        elif culprit and f == "weak_gpu":
            clock *= 0.85
            power *= 0.93
    attrs: dict[str, Scalar] = {
        "gpu": gpu,
        "uuid": f"GPU-{run.seed:04x}-{node_i:04x}-{gpu:04x}",
        "pci_bus_id": f"0000:{0x18 + gpu * 0x10:02x}:00.0",
        "model": MODEL,
        "window_s": run.window_s,
        "window_start": run.start + t,
        "samples": 5,
        "util_mean": round(util, 2),
        "power_mean": round(power, 1),
        "sm_clock_mean": round(clock, 1),
        "sm_clock_max_rated": CLOCK_MHZ,
        "nvlink_tx_mean": round(link * 0.45, 0),
        "nvlink_rx_mean": round(link * 0.45, 0),
        "pcie_tx_mean": round(link * 0.05, 0),
        "pcie_rx_mean": round(link * 0.05, 0),
        "hw_slowdown_frac": reasons["hw_slowdown"],
        "thermal_frac": reasons["thermal"],
        "power_brake_frac": reasons["power_brake"],
    }
    attrs["job"] = run.job
    node = run.node_name(node_i)
    return Event(
        stable_id(node, "gpu_summary", attrs["uuid"], t), node, "nvml", "gpu_summary", run.start + end, attrs
    )
