"""The fleet as the detectors see it: per-GPU window history, hardware events per node, job heartbeats.

Fed every event the engine ingests (:meth:`FleetState.observe`); the detectors only read it. Memory is
bounded: a GPU keeps ``history_s`` of windows, a node its last 64 hardware events, and GPUs, nodes and ranks
that fell silent are pruned. Between prunes it is bounded whatever the inputs, by count and by bytes: at most
``max_nodes`` nodes and an estimated ``max_bytes`` of state (:mod:`watchd.detect.fleet_bytes`), the node
that reported least recently evicted first (with everything kept about it: GPUs, windows, faults, ranks),
and GPU indexes below ``max_gpus_per_node``; each eviction or refusal is counted in
:attr:`FleetState.evicted`.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

from watchd.detect import fleet_bytes as cost
from watchd.detect.spins import SPIN_CONDITION, Spin, Spins
from watchd.detect.tracks import GpuTrack, HardwareEvent, RankTrack, Window
from watchd.detect.trainlog_evidence import TrainingEvidence
from watchd.jobs.topology import JobTopology
from watchd.model.conditions import (
    APPLICATION_XID_BUCKETS,
    HARDWARE_CONDITIONS,
    HARDWARE_XID_BUCKETS,
    SLOWDOWN_CONDITIONS,
)
from watchd.model.events import Event
from watchd.model.gpu import HEALTH_KIND, SUMMARY_KIND, GpuHealth, GpuSummary
from watchd.model.heartbeat import DEFAULT_PHASE, Heartbeat
from watchd.model.heartbeat import KIND as HEARTBEAT_KIND
from watchd.model.heartbeat import QUIET_PHASES as QUIET_PHASES  # the detectors' name for it
from watchd.model.ib import KIND as IB_KIND
from watchd.model.ib import LINK_COUNTERS, LINK_ERRORS, IbPortHealth
from watchd.model.jobs import job_label
from watchd.model.xid import KIND as XID_KIND
from watchd.model.xid import Xid
from watchd.slices import Steps, run_all
from watchd.xid.pci import normalize_pci

# Which signals are hardware evidence, which are slowdown attribution: the model's table
# (watchd.model.conditions): HARDWARE_CONDITIONS, SLOWDOWN_CONDITIONS, HARDWARE_XID_BUCKETS.
_EWMA = 0.2
MAX_NODES = 131_072  # a 100,000-GPU fleet of 1-GPU nodes, with room: the bound any input can reach
MAX_GPUS_PER_NODE = 64  # GPU indexes 0..63 (the largest nodes have 16)
MAX_BYTES = 2048 * 1024 * 1024  # 100,000 GPUs with 300 s of 5 s windows take about 850 MiB


def _window_len(track: GpuTrack) -> float:
    ws = track.windows
    return ws[-1].end - ws[-2].end if len(ws) >= 2 and ws[-1].end > ws[-2].end else 5.0


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


#: what the fleet keeps of a summary, read without building the whole GpuSummary (on the ingest path)
_PICK_SUMMARY = GpuSummary.picker(
    "gpu",
    "job",
    "pci_bus_id",
    "model",
    "util_mean",
    "power_mean",
    "sm_clock_mean",
    "nvlink_tx_mean",
    "nvlink_rx_mean",
    "pcie_tx_mean",
    "pcie_rx_mean",
    "hw_slowdown_frac",
    "thermal_frac",
    "power_brake_frac",
    "window_s",
)


class FleetState:
    def __init__(
        self,
        topology: JobTopology | None = None,
        history_s: float = 300.0,
        spin_power_ratio: float = 0.6,
        rank_ttl_s: float = 600.0,
        max_nodes: int = MAX_NODES,
        max_gpus_per_node: int = MAX_GPUS_PER_NODE,
        max_bytes: int = MAX_BYTES,
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
        self.lost_by_node: dict[str, dict[int, float]] = {}  # the same as ``lost``, indexed by node
        # the agents' sub-window hang signature (``gpu_health`` ``nccl_spin``): (node, gpu) -> its spin
        self.spinning = Spins()
        self.max_nodes = max_nodes
        self.max_gpus_per_node = max_gpus_per_node
        self.max_bytes = max_bytes
        # node -> when it last reported, least recent first: the eviction order (ordered: a plain dict's
        # first key gets slow to find after many deletions at its front)
        self._recency: OrderedDict[str, float] = OrderedDict()
        self._ranks_on: dict[str, set[tuple[str, int]]] = {}  # node -> (job, rank) of the ranks it reports
        self._node_bytes: dict[str, int] = {}  # what each node's state costs (fleet_bytes' estimate)
        self.bytes = 0  # their sum
        # counted for watchd_fleet_evicted_total{what}: node (to stay within max_nodes and max_bytes) and gpu
        # (an index past max_gpus_per_node, refused)
        self.evicted: dict[str, int] = {"node": 0, "gpu": 0}
        # what the training stack said (watchdog timeouts, NCCL WARN lines, Flight Recorder dumps)
        self.training = TrainingEvidence(self.topology.job_of, rank_node=self._rank_node)
        self._handlers = self.subscriptions()

    def _charge(self, node: str, n: int) -> None:
        self._node_bytes[node] = self._node_bytes.get(node, 0) + n
        self.bytes += n

    def _touch(self, node: str, at: float) -> None:
        """``node`` reported now: it moves to the end of the eviction order."""
        recency = self._recency
        if node in recency:
            recency.move_to_end(node)
        else:
            self._charge(node, cost.node(node))
        recency[node] = at

    def _evict_over_bounds(self) -> None:
        """Evict the nodes that reported least recently (all of their state) while there are more than
        ``max_nodes`` or their state costs more than ``max_bytes``; never the node that reported last."""
        recency = self._recency
        while len(recency) > 1 and (len(recency) > self.max_nodes or self.bytes > self.max_bytes):
            self.forget_node(next(iter(recency)))
            self.evicted["node"] += 1

    def forget_node(self, node: str) -> None:
        """Drop everything kept about ``node`` (its GPUs, lost GPUs, hardware events, PCI map, ranks)."""
        self._recency.pop(node, None)
        for gpu in range(self.max_gpus_per_node):
            self.gpus.pop((node, gpu), None)
        for gpu in self.lost_by_node.pop(node, {}):
            self.lost.pop((node, gpu), None)
        if self.spinning:
            self._charge(node, self.spinning.forget_node(node, self.max_gpus_per_node))
        self.hardware.pop(node, None)
        self.pci.pop(node, None)
        for job, rank in self._ranks_on.pop(node, ()):
            ranks = self.ranks.get(job)
            if ranks is not None:
                ranks.pop(rank, None)
                if not ranks:
                    del self.ranks[job]
        self.bytes -= self._node_bytes.pop(node, 0)
        self.topology.forget_node(node)

    def _set_lost(self, node: str, gpu: int, at: float) -> None:
        if self.lost.get((node, gpu)) is None:
            self._charge(node, cost.LOST)
        self.lost[(node, gpu)] = at
        self.lost_by_node.setdefault(node, {})[gpu] = at

    def _clear_lost(self, node: str, gpu: int) -> None:
        if self.lost.pop((node, gpu), None) is None:
            return
        self._charge(node, -cost.LOST)
        lost = self.lost_by_node.get(node)
        if lost is not None:
            lost.pop(gpu, None)
            if not lost:
                del self.lost_by_node[node]

    def _gpu_in_bounds(self, gpu: int) -> bool:
        if 0 <= gpu < self.max_gpus_per_node:
            return True
        self.evicted["gpu"] += 1  # refused: counted with the evictions
        return False

    # -------------------------------------------------------------------------------- observing

    def subscriptions(self) -> dict[str, Callable[[Event], None]]:
        """The kinds the fleet state keeps, each with its handler (each ends with the eviction to the
        bounds; the training stack's evidence is bounded on its own)."""
        return {
            **{kind: self._bounded(take) for kind, take in self._kept().items()},
            **dict.fromkeys(self.training.subscriptions(), self.on_training),
        }

    def _kept(self) -> dict[str, Callable[[Event], None]]:
        return {
            SUMMARY_KIND: self._summary,
            HEARTBEAT_KIND: self._heartbeat,
            XID_KIND: self._xid,
            HEALTH_KIND: self._health,
            IB_KIND: self._ib_port,
        }

    def _bounded(self, take: Callable[[Event], None]) -> Callable[[Event], None]:
        evict = self._evict_over_bounds

        def bounded(event: Event) -> None:
            take(event)
            evict()

        return bounded

    def observe(self, event: Event) -> None:
        """One event of any kind (what the engine's dispatch does with :meth:`subscriptions`)."""
        handler = self._handlers.get(event.kind)
        if handler is not None:
            handler(event)

    def on_training(self, event: Event) -> None:
        """What the training stack said (bounded on its own: trainlog_evidence.py)."""
        self.training.observe(event)
        if self.training.dropped:
            self.evicted["trainlog"] = self.training.dropped

    def _summary(self, e: Event) -> None:
        picked = _PICK_SUMMARY(e.attrs)
        if picked is None:
            return
        gpu, label, pci_bus_id, model, util, power, clock, tx, rx, ptx, prx, hw, thermal, brake, window_s = (
            picked
        )
        if not self._gpu_in_bounds(gpu):
            return
        key = (e.node, gpu)
        self._touch(e.node, e.time)
        track = self.gpus.get(key)
        if track is None:
            track = self.gpus[key] = GpuTrack(e.node, gpu)
            self._charge(e.node, cost.GPU)
        job = job_label(label)
        if job != track.job:
            track.job, track.computed_s = job, 0.0
            track.power_base = track.link_base = None
        if pci_bus_id is not None:
            by_pci = self.pci.get(e.node)
            pci = normalize_pci(pci_bus_id) or pci_bus_id
            if by_pci is None or pci not in by_pci:
                self._charge(e.node, cost.pci(pci, by_pci is None))
            self.pci.setdefault(e.node, {})[pci] = gpu
        track.model = model if model is not None else track.model
        # the picker read the numbers: each is finite or None
        links = [float(x) for x in (tx, rx, ptx, prx) if x is not None]
        w = Window(
            e.time,
            None if util is None else float(util),
            None if power is None else float(power),
            None if clock is None else float(clock),
            sum(links) if links else None,
            float(hw or 0.0),
            float(thermal or 0.0),
            float(brake or 0.0),
        )
        if track.windows and w.end <= track.windows[-1].end:
            return  # a re-sent or late window: history stays in time order
        windows = track.windows
        windows.append(w)
        horizon = w.end - self.history_s
        stale = 0
        while stale < len(windows) and windows[stale].end < horizon:
            stale += 1
        if stale:
            del windows[:stale]
        self._charge(e.node, (1 - stale) * cost.WINDOW)
        self._learn_baseline(track, w, float(window_s or 5.0))
        track.last_seen = e.time
        self._clear_lost(e.node, gpu)
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
        hb = Heartbeat.read(e)
        job = job_label(hb.job) if hb is not None else None
        if hb is None or job is None:
            return
        rank = hb.rank
        step = hb.step
        ranks = self.ranks.setdefault(job, {})
        track = ranks.get(rank)
        if track is None:
            track = ranks[rank] = RankTrack(job, rank, e.node, last_advance=e.time)
            self._ranks_on.setdefault(e.node, set()).add((job, rank))
            self._charge(e.node, cost.rank(job))
        if e.time < track.last_report:
            return  # out of order: an older report
        if track.node != e.node:  # the rank moved (a requeue): its cost and eviction go with it
            self._move_rank(track, e.node)
        self._touch(e.node, e.time)
        track.gpu = hb.gpu if hb.gpu is not None else track.gpu
        was_quiet = track.phase in QUIET_PHASES
        track.phase = hb.phase or DEFAULT_PHASE
        if step > track.step:
            if track.steps_seen:
                gap = e.time - track.last_advance
                every = track.advance_every
                track.advance_every = gap if every is None else every + _EWMA * (gap - every)
            track.step = step
            track.steps_seen += 1
            track.last_advance = e.time
            st, ct = _float(hb.step_time_s), _float(hb.compute_time_s)
            if st is not None:
                track.step_times.append(st)
            if ct is not None:
                track.compute_times.append(ct)
        elif was_quiet or track.phase in QUIET_PHASES:
            track.last_advance = e.time  # a declared pause restarts the clock, and so does its end
        if hb.collective_seq is not None:
            track.collective_seq = hb.collective_seq
        track.last_report = e.time
        if track.phase != "done":
            self.topology.observe_rank(e.node, job, track.gpu, e.time)

    def _rank_node(self, job: str, rank: int) -> str | None:
        """The node ``rank`` of ``job`` sends its heartbeats from."""
        track = self.ranks.get(job, {}).get(rank)
        return track.node if track is not None else None

    def _xid(self, e: Event) -> None:
        x = Xid.read(e)
        if x is None:
            return
        bucket = x.bucket if x.bucket is not None else "UNKNOWN"
        hardware = bucket in HARDWARE_XID_BUCKETS
        if not hardware and bucket not in APPLICATION_XID_BUCKETS:
            return  # informational Xids say nothing about a culprit
        gpu = self._gpu_of_pci(e.node, x.pci_bus_id)
        self._hardware(HardwareEvent(e.time, e.node, gpu, f"xid {x.xid} ({bucket})", hardware, bucket))

    def _health(self, e: Event) -> None:
        h = GpuHealth.read(e)
        if h is not None and h.condition == SPIN_CONDITION:
            self._spin(e, h)
            return
        if h is None or not h.value:
            return  # value 0: the condition cleared
        condition = h.condition
        if h.gpu is not None and not self._gpu_in_bounds(h.gpu):
            return
        if condition == "gpu_lost" and h.gpu is not None:
            self._touch(e.node, e.time)
            self._set_lost(e.node, h.gpu, e.time)
        if condition in HARDWARE_CONDITIONS or condition in SLOWDOWN_CONDITIONS:
            evidence = h.evidence
            what = f"{condition}: {evidence}" if evidence else condition
            hardware = condition in HARDWARE_CONDITIONS
            self._hardware(HardwareEvent(e.time, e.node, h.gpu, what, hardware, condition))

    def _spin(self, e: Event, h: GpuHealth) -> None:
        if h.gpu is not None and self._gpu_in_bounds(h.gpu):
            self._touch(e.node, e.time)
            self._charge(e.node, self.spinning.report(e.node, h.gpu, h.value, h.extra.get("since"), e.time))

    def spin_of(self, node: str, gpu: int, now: float) -> Spin | None:
        """The GPU's spin as its agent reported it (:mod:`watchd.detect.spins`), unless a whole window that
        began after it started says the GPU does not spin (the clear was lost)."""
        spin = self.spinning.fresh(node, gpu, now)
        track = self.gpus.get((node, gpu))
        if spin is None or track is None or not track.windows:
            return spin
        w, base = track.windows[-1], track.power_base
        if w.end - _window_len(track) < spin.since or w.end <= spin.reported:
            return spin
        if w.util is None or w.power is None or base is None:
            return None
        return spin if w.util >= 90.0 and w.power <= self.spin_power_ratio * base else None

    def _ib_port(self, e: Event) -> None:
        """An InfiniBand/RoCE port down, downtrained or with climbing link counters: hardware evidence on the
        node (its NIC, cable or switch port), with no GPU. A site's threshold on another counter (a transport
        counter of ``hw_counters``: as often the peer's or the fabric's doing) is no evidence here."""
        h = IbPortHealth.read(e)
        if h is None or not h.value:
            return  # value 0: the condition cleared
        if h.condition == LINK_ERRORS and h.counter not in LINK_COUNTERS:
            return
        what = f"ib {h.condition}: {h.evidence or f'{h.device}:{h.port}'}"
        self._hardware(HardwareEvent(e.time, e.node, None, what, True, f"ib_{h.condition}"))

    def _hardware(self, h: HardwareEvent) -> None:
        self._touch(h.node, h.time)
        events = self.hardware.get(h.node)
        if events is None:
            events = self.hardware[h.node] = deque(maxlen=64)
            self._charge(h.node, cost.HARDWARE_FIRST)
        elif len(events) == events.maxlen:
            self._charge(h.node, -cost.hardware(events[0].what, False))  # pushed out by this one
        events.append(h)
        self._charge(h.node, cost.hardware(h.what, False))

    def _move_rank(self, track: RankTrack, node: str) -> None:
        key = (track.job, track.rank)
        on_old = self._ranks_on.get(track.node)
        if on_old is not None:
            on_old.discard(key)
            if not on_old:
                del self._ranks_on[track.node]
        if track.node in self._node_bytes:
            self._charge(track.node, -cost.rank(track.job))
        self._ranks_on.setdefault(node, set()).add(key)
        self._charge(node, cost.rank(track.job))
        track.node = node

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

    def nodes(
        self,
        now: float,
        recent_s: float = 86400.0,
        *,
        limit: int | None = None,
        node: str | None = None,
        troubled_first: Callable[[str], bool] | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """Each node the agents report on, as the status API shows it: its GPUs, their jobs, when it last
        reported, GPUs NVML called lost, and its GPU faults of the last ``recent_s``; and how many nodes
        match in all. Linear in the nodes (no sort of them all when ``limit`` is given); only the ``limit``
        nodes shown are described.

        Order: troubled nodes first (a lost GPU, a recent fault, or ``troubled_first(node)``), each group by
        name. ``node``: only that node (an exact name) or, ending in ``*``, the nodes with that prefix."""
        names: Iterable[str] = self._recency  # every node with state (kept in step by _touch and prune)
        if node is not None:
            if node.endswith("*"):
                prefix = node[:-1]
                names = [n for n in names if n.startswith(prefix)]
            else:
                names = [node] if node in self._recency else []
        since = now - recent_s
        troubled: list[str] = []
        calm: list[str] = []
        for name in names:
            events = self.hardware.get(name)
            if (
                name in self.lost_by_node
                or (events and events[-1].time >= since)
                or (troubled_first is not None and troubled_first(name))
            ):
                troubled.append(name)
            else:
                calm.append(name)
        total = len(troubled) + len(calm)
        troubled.sort()
        if limit is None:
            shown = troubled + sorted(calm)
        else:
            limit = max(0, limit)
            shown = troubled[:limit] + heapq.nsmallest(max(0, limit - len(troubled)), calm)
        out = []
        gpus = self.gpus
        for name in shown:
            tracks = [t for g in range(self.max_gpus_per_node) if (t := gpus.get((name, g))) is not None]
            faults = [h for h in self.hardware.get(name, ()) if h.time >= since]
            out.append(
                {
                    "node": name,
                    "gpus": len(tracks),
                    "jobs": sorted({t.job for t in tracks if t.job is not None}),
                    "last_report": max((t.last_seen for t in tracks), default=None),
                    "lost_gpus": sorted(self.lost_by_node.get(name, ())),
                    "recent_faults": len(faults),
                    "last_fault": faults[-1].what if faults else None,
                }
            )
        return out, total

    def hardware_events(self, node: str, since: float) -> list[HardwareEvent]:
        return [h for h in self.hardware.get(node, ()) if h.time >= since]

    def prune(self, now: float) -> None:
        run_all(self.prune_steps(now))

    def prune_steps(self, now: float) -> Steps[None]:
        """:meth:`prune` in steps (:mod:`watchd.slices`; about 0.13 s at once at 100,000 GPUs): each step
        reads and changes the state as it is then, so what is observed between steps is kept or pruned as
        it should be."""
        horizon = now - self.history_s
        for key in [k for k, t in self.gpus.items() if t.last_seen < horizon]:
            del self.gpus[key]
        for key in [k for k, t in self.lost.items() if t < horizon]:
            self._clear_lost(*key)
        for node in self.spinning.prune(now):
            self._charge(node, -cost.SPIN)
        yield
        for node in [n for n, q in self.hardware.items() if not q or q[-1].time < now - 86400.0]:
            del self.hardware[node]
        tracked = {node for node, _ in self.gpus}
        for node in [n for n in self.pci if n not in tracked]:
            del self.pci[node]
        yield
        rank_horizon = now - self.rank_ttl_s
        for job in list(self.ranks):
            ranks = self.ranks[job]
            for rank in [r for r, t in ranks.items() if t.last_report < rank_horizon]:
                del ranks[rank]
            if not ranks:
                del self.ranks[job]
        self._ranks_on = {}
        for job, ranks in self.ranks.items():
            for rank, track in ranks.items():
                self._ranks_on.setdefault(track.node, set()).add((job, rank))
        yield
        tracked = {node for node, _ in self.gpus}
        kept = tracked | self.hardware.keys() | self.lost_by_node.keys() | self._ranks_on.keys()
        for node in [n for n in self._recency if n not in kept]:
            del self._recency[node]
        yield
        self._recount()
        yield
        self.training.prune(now)
        yield
        yield from self.topology.prune_steps(now)

    def _recount(self) -> None:
        """What the state costs, counted afresh (the running count is kept exact between prunes too; this
        keeps any drift from lasting)."""
        by_node = {node: cost.node(node) for node in self._recency}
        for (node, _), track in self.gpus.items():
            by_node[node] = by_node.get(node, 0) + cost.GPU + cost.WINDOW * len(track.windows)
        for node, events in self.hardware.items():
            by_node[node] = (
                by_node.get(node, 0) + cost.HARDWARE_FIRST + sum(cost.hardware(h.what, False) for h in events)
            )
        for node, lost in self.lost_by_node.items():
            by_node[node] = by_node.get(node, 0) + cost.LOST * len(lost)
        for node, _ in self.spinning.table:
            by_node[node] = by_node.get(node, 0) + cost.SPIN
        for node, by_pci in self.pci.items():
            by_node[node] = by_node.get(node, 0) + sum(cost.pci(p, i == 0) for i, p in enumerate(by_pci))
        for node, keys in self._ranks_on.items():
            by_node[node] = by_node.get(node, 0) + sum(cost.rank(job) for job, _ in keys)
        self._node_bytes = by_node
        self.bytes = sum(by_node.values())
