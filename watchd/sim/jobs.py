"""Simulated jobs at the level the engine sees them: per-GPU window summaries, hardware events and
forwarded heartbeats, for the detector tests and the evaluation suite (``benchmarks/detection.py``).

The signal levels follow the fake GPU backend (:mod:`watchd.sim.gpu`): healthy training at 0.7-0.9 of TDP
with per-GPU offsets, the NCCL spin at ~0.35 of TDP with no link traffic, idle at ~0.13. Healthy runs carry
realistic noise: per-GPU silicon offsets, communication-heavy phases (power down, links busy), one-window
dips of one GPU, lost windows, and step-time jitter.
"""

from __future__ import annotations

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
    "hang_nic",  # one node's NIC fails (NET/IB completion errors, issue 19): every rank spins, no Xid
    "host_stall",  # every rank idle at once (data loader, storage)
    "thermal",  # one GPU throttles (thermal): clock 0.7x
    "power_brake",  # one GPU power-braked: clock 0.35x
    "node_power_brake",  # every GPU of one node power-braked (a PSU or BMC cap): clock 0.6x
    "weak_gpu",  # one GPU clocks 15% low with no reason (below the fleet median)
    "pipeline",  # pipeline stages unequally loaded: slow but healthy
    "checkpoint",  # a pause for a checkpoint: GPUs idle for 90 s
    "transients",  # the job starts (idle, loading) and ends inside the run
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

    def node_name(self, i: int) -> str:
        return f"{self.node_prefix}-{i:04d}"

    @property
    def culprit_node(self) -> str:
        return self.node_name(self.culprit[0])

    @property
    def nodes_list(self) -> tuple[str, ...]:
        return tuple(self.node_name(i) for i in range(self.nodes))

    def fault_active(self, t: float) -> bool:
        if self.fault in ("none", "transients") or t < self.fault_at:
            return False
        return self.fault_for_s is None or t < self.fault_at + self.fault_for_s


def simulate(run: JobRun) -> Iterator[Event]:
    """Every event of the run in time order (windows at their end, heartbeats at their forwarding)."""
    rng = random.Random(run.seed)
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
                run, rng, gpus, t, t_next, next_hb, rank_step, seq, reported_phase, hb_period, step_time
            )
        if not hardware_sent and run.fault_active(t + ws / 2) and run.fault in ("hang_lost", "hang_nvlink"):
            hardware_sent = True
            yield from _hardware_events(run, run.start + run.fault_at + 1.0)
        comm_phase = rng.random() < 0.03  # a communication-heavy phase: power down, links busy
        for key in gpus:
            w = _window(run, rng, key, t, comm_phase, power_offset[key], clock_offset[key])
            if w is not None:
                yield w
        t = t_next


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
) -> Iterator[Event]:
    hung = run.fault.startswith("hang") or run.fault == "host_stall"
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
            if hung and key != run.culprit and run.fault_active(at + period):
                attrs["collective_seq"] = seq[key] + 1  # entered the collective the culprit never reaches
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
    elif fault_on:
        f = run.fault
        if f.startswith("hang"):
            if culprit and f == "hang_lost":
                return None  # the GPU fell off the bus: NVML has no samples for it
            if culprit and f == "hang_compute":
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
