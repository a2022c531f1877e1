"""The fleet as the detectors see it: per-GPU window history, hardware events per node, job heartbeats.

Fed every event the engine ingests (:meth:`FleetState.observe`); the detectors only read it. Memory is
bounded: a GPU keeps ``history_s`` of windows, a node its last 64 hardware events, and GPUs, nodes and ranks
that fell silent are pruned.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from watchd.gpu.jobs import parse_job_label
from watchd.jobs.topology import JobTopology
from watchd.model.events import Event
from watchd.xid.pci import normalize_pci

# Conditions that are hardware faults (docs/rules.md, gpu_health); the clock-event ones are attribution for
# stragglers, not culprits of a hang.
HARDWARE_CONDITIONS = frozenset(
    {
        "gpu_lost",
        "ecc_dbe",
        "row_remap_failure",
        "row_remap_pending",
        "nvlink_down",
        "pcie_downtrain",
        "recovery_action",
    }
)
SLOWDOWN_CONDITIONS = frozenset({"hw_slowdown", "thermal_slowdown", "power_brake"})
# Xid buckets that implicate the GPU's hardware (not the application, not informational).
HARDWARE_XID_BUCKETS = frozenset(
    {
        "RESET_GPU",
        "RESTART_BM",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
        "XID_154",
        "CHECK_MECHANICALS",
        "CONTACT_SUPPORT",
    }
)
QUIET_PHASES = frozenset({"checkpoint", "eval", "init", "done"})
_EWMA = 0.2


def job_label(value: object) -> str | None:
    """A job as the agents label it; a bare Slurm job id (``1234``: SLURM_JOB_ID) becomes ``slurm:1234``."""
    if value is None:
        return None
    text = str(value)
    if parse_job_label(text) is not None:
        return text
    if text.isascii() and text.isdigit():
        return f"slurm:{text}"
    return text or None


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True, slots=True)
class Window:
    """One ``gpu_summary``, reduced to what the detectors use."""

    end: float
    util: float | None
    power: float | None
    clock: float | None
    link: float | None  # NVLink + PCIe bytes/s, both directions
    hw_slowdown: float
    thermal: float
    power_brake: float


@dataclass(slots=True)
class GpuTrack:
    node: str
    gpu: int
    model: str | None = None
    job: str | None = None
    windows: deque[Window] = field(default_factory=deque)
    power_base: float | None = None  # running baseline while computing (never fed by spin windows)
    link_base: float | None = None
    computed_s: float = 0.0  # time spent computing under the current job
    last_seen: float = 0.0

    def latest(self) -> Window | None:
        return self.windows[-1] if self.windows else None


@dataclass(frozen=True, slots=True)
class HardwareEvent:
    time: float
    node: str
    gpu: int | None
    what: str  # "xid 79 (RESTART_BM)", "gpu_lost", ...
    hardware: bool  # False: an application Xid (evidence of a culprit, not of a fault)
    condition: str  # xid bucket or gpu_health condition


@dataclass(slots=True)
class RankTrack:
    job: str
    rank: int
    node: str
    gpu: int | None = None
    step: int = -1
    steps_seen: int = 0
    phase: str = "train"
    collective_seq: int | None = None
    last_report: float = 0.0
    last_advance: float = 0.0
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=16))
    compute_times: deque[float] = field(default_factory=lambda: deque(maxlen=16))

    def median_step(self) -> float | None:
        return _median(self.step_times)

    def median_compute(self) -> float | None:
        return _median(self.compute_times)


def median(values: Iterable[float]) -> float:
    """The median of a non-empty collection."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _median(values: deque[float]) -> float | None:
    return median(values) if values else None


class FleetState:
    def __init__(
        self,
        topology: JobTopology | None = None,
        history_s: float = 300.0,
        spin_power_ratio: float = 0.6,
        rank_ttl_s: float = 600.0,
    ) -> None:
        self.topology = topology if topology is not None else JobTopology()
        self.history_s = history_s
        self.spin_power_ratio = spin_power_ratio
        self.rank_ttl_s = rank_ttl_s
        self.gpus: dict[tuple[str, int], GpuTrack] = {}
        self.hardware: dict[str, deque[HardwareEvent]] = {}
        self.ranks: dict[str, dict[int, RankTrack]] = {}  # job -> rank -> track
        self.lost: dict[tuple[str, int], float] = {}  # (node, gpu) -> when NVML said lost
        self.pci: dict[str, dict[str, int]] = {}  # node -> PCI bus id -> GPU index (from the summaries)

    # -------------------------------------------------------------------------------- observing

    def observe(self, event: Event) -> None:
        kind = event.kind
        if kind == "gpu_summary":
            self._summary(event)
        elif kind == "heartbeat":
            self._heartbeat(event)
        elif kind == "xid":
            self._xid(event)
        elif kind == "gpu_health":
            self._health(event)

    def _summary(self, e: Event) -> None:
        a = e.attrs
        gpu = a.get("gpu")
        if not isinstance(gpu, int) or isinstance(gpu, bool):
            return
        key = (e.node, gpu)
        track = self.gpus.get(key)
        if track is None:
            track = self.gpus[key] = GpuTrack(e.node, gpu)
        job = job_label(a.get("job"))
        if job != track.job:
            track.job, track.computed_s = job, 0.0
            track.power_base = track.link_base = None
        pci = a.get("pci_bus_id")
        if isinstance(pci, str):
            self.pci.setdefault(e.node, {})[normalize_pci(pci) or pci] = gpu
        model = a.get("model")
        track.model = model if isinstance(model, str) else track.model
        links = [_num(a.get(k)) for k in ("nvlink_tx_mean", "nvlink_rx_mean", "pcie_tx_mean", "pcie_rx_mean")]
        present = [x for x in links if x is not None]
        w = Window(
            end=e.time,
            util=_num(a.get("util_mean")),
            power=_num(a.get("power_mean")),
            clock=_num(a.get("sm_clock_mean")),
            link=sum(present) if present else None,
            hw_slowdown=_num(a.get("hw_slowdown_frac")) or 0.0,
            thermal=_num(a.get("thermal_frac")) or 0.0,
            power_brake=_num(a.get("power_brake_frac")) or 0.0,
        )
        if track.windows and w.end <= track.windows[-1].end:
            return  # a re-sent or late window: history stays in time order
        track.windows.append(w)
        horizon = w.end - self.history_s
        while track.windows and track.windows[0].end < horizon:
            track.windows.popleft()
        self._learn_baseline(track, w, _num(a.get("window_s")) or 5.0)
        track.last_seen = e.time
        self.lost.pop(key, None)
        self.topology.observe_gpu(e.node, gpu, job, e.time)

    def _learn_baseline(self, track: GpuTrack, w: Window, window_s: float) -> None:
        """Baselines learn only from computing windows: a hang must never pull them down to its own level."""
        if w.util is None or w.util < 50 or w.power is None:
            return
        base = track.power_base
        if base is not None and w.power < self.spin_power_ratio * base:
            return
        track.power_base = w.power if base is None else base + _EWMA * (w.power - base)
        if w.link is not None:
            lb = track.link_base
            track.link_base = w.link if lb is None else lb + _EWMA * (w.link - lb)
        track.computed_s += window_s

    def _heartbeat(self, e: Event) -> None:
        a = e.attrs
        job = job_label(a.get("job"))
        rank = a.get("rank")
        step = a.get("step")
        if job is None or not isinstance(rank, int) or not isinstance(step, int):
            return
        ranks = self.ranks.setdefault(job, {})
        track = ranks.get(rank)
        if track is None:
            track = ranks[rank] = RankTrack(job, rank, e.node, last_advance=e.time)
        if e.time < track.last_report:
            return  # out of order: an older report
        track.node = e.node
        gpu = a.get("gpu")
        track.gpu = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else track.gpu
        phase = a.get("phase")
        was_quiet = track.phase in QUIET_PHASES
        track.phase = phase if isinstance(phase, str) and phase else "train"
        if step > track.step:
            track.step = step
            track.steps_seen += 1
            track.last_advance = e.time
            st, ct = _num(a.get("step_time_s")), _num(a.get("compute_time_s"))
            if st is not None:
                track.step_times.append(st)
            if ct is not None:
                track.compute_times.append(ct)
        elif was_quiet or track.phase in QUIET_PHASES:
            track.last_advance = e.time  # a declared pause restarts the clock, and so does its end
        seq = a.get("collective_seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            track.collective_seq = seq
        track.last_report = e.time
        if track.phase != "done":
            self.topology.observe_rank(e.node, job, track.gpu, e.time)

    def _xid(self, e: Event) -> None:
        xid = e.attrs.get("xid")
        bucket = e.attrs.get("bucket")
        bucket = bucket if isinstance(bucket, str) else "UNKNOWN"
        hardware = bucket in HARDWARE_XID_BUCKETS
        if not hardware and bucket != "RESTART_APP":
            return  # informational Xids say nothing about a culprit
        gpu = self._gpu_of_pci(e.node, e.attrs.get("pci_bus_id"))
        self._hardware(HardwareEvent(e.time, e.node, gpu, f"xid {xid} ({bucket})", hardware, bucket))

    def _health(self, e: Event) -> None:
        condition = e.attrs.get("condition")
        value = _num(e.attrs.get("value"))
        if not isinstance(condition, str) or not value:
            return  # value 0: the condition cleared
        gpu = e.attrs.get("gpu")
        gpu_index = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None
        if condition == "gpu_lost" and gpu_index is not None:
            self.lost[(e.node, gpu_index)] = e.time
        if condition in HARDWARE_CONDITIONS or condition in SLOWDOWN_CONDITIONS:
            evidence = e.attrs.get("evidence")
            what = f"{condition}: {evidence}" if isinstance(evidence, str) and evidence else condition
            hardware = condition in HARDWARE_CONDITIONS
            self._hardware(HardwareEvent(e.time, e.node, gpu_index, what, hardware, condition))

    def _hardware(self, h: HardwareEvent) -> None:
        self.hardware.setdefault(h.node, deque(maxlen=64)).append(h)

    def _gpu_of_pci(self, node: str, pci: object) -> int | None:
        if not isinstance(pci, str):
            return None
        return self.pci.get(node, {}).get(normalize_pci(pci) or pci)

    # -------------------------------------------------------------------------------- queries

    def job_on_gpu(self, e: Event) -> str | None:
        """The job the agents last saw on the GPU ``e`` names (its ``gpu`` index, else its ``pci_bus_id``),
        within the topology's member TTL of ``e``'s time; None when unknown."""
        gpu = e.attrs.get("gpu")
        if not isinstance(gpu, int) or isinstance(gpu, bool):
            gpu = self._gpu_of_pci(e.node, e.attrs.get("pci_bus_id"))
        return None if gpu is None else self.topology.job_of(e.node, gpu, e.time)

    def nodes(self, now: float, recent_s: float = 86400.0) -> list[dict[str, Any]]:
        """Each node the agents report on, as the status API shows it: its GPUs, their jobs, when it last
        reported, GPUs NVML called lost, and its GPU faults of the last ``recent_s``."""
        by_node: dict[str, list[GpuTrack]] = {}
        for (node, _), track in self.gpus.items():
            by_node.setdefault(node, []).append(track)
        out = []
        for node in sorted({*by_node, *self.hardware}):
            tracks = sorted(by_node.get(node, []), key=lambda t: t.gpu)
            faults = [h for h in self.hardware.get(node, ()) if h.time >= now - recent_s]
            out.append(
                {
                    "node": node,
                    "gpus": len(tracks),
                    "jobs": sorted({t.job for t in tracks if t.job is not None}),
                    "last_report": max((t.last_seen for t in tracks), default=None),
                    "lost_gpus": sorted(g for (n, g) in self.lost if n == node),
                    "recent_faults": len(faults),
                    "last_fault": faults[-1].what if faults else None,
                }
            )
        return out

    def hardware_events(self, node: str, since: float) -> list[HardwareEvent]:
        return [h for h in self.hardware.get(node, ()) if h.time >= since]

    def prune(self, now: float) -> None:
        horizon = now - self.history_s
        for key in [k for k, t in self.gpus.items() if t.last_seen < horizon]:
            del self.gpus[key]
        for key in [k for k, t in self.lost.items() if t < horizon]:
            del self.lost[key]
        for node in [n for n, q in self.hardware.items() if not q or q[-1].time < now - 86400.0]:
            del self.hardware[node]
        tracked = {node for node, _ in self.gpus}
        for node in [n for n in self.pci if n not in tracked]:
            del self.pci[node]
        rank_horizon = now - self.rank_ttl_s
        for job in list(self.ranks):
            ranks = self.ranks[job]
            for rank in [r for r, t in ranks.items() if t.last_report < rank_horizon]:
                del ranks[rank]
            if not ranks:
                del self.ranks[job]
        self.topology.prune(now)
