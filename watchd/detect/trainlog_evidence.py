"""What the training stack said about each job, kept for the hang detector (issue 19). Pure.

Fed the training-log kinds (:mod:`watchd.model.trainlog`) by :class:`~watchd.detect.fleet.FleetState`:

* per job and rank: the last collective known completed (Flight Recorder dumps, the watchdog's work-status
  line), the collective it timed out on, when that collective began (report time minus how long it ran) and
  a CUDA error it reported;
* per node: NET/IB completion errors (with the NIC where the line names it) and CUDA failures.

Bounded whatever the input: at most ``max_jobs`` jobs and ``max_ranks`` ranks per job (the evidence of a new
rank beyond it is dropped and counted), 64 NIC and 16 CUDA errors per node, at most ``max_nodes`` nodes;
everything older than ``ttl_s`` is pruned. A line without a job (a journald unit, a plain file) still counts
for its node, and for the job running on its GPU when it names one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from watchd.model.events import Event
from watchd.model.jobs import job_label
from watchd.model.trainlog import CollectiveReport, CollectiveTimeout, FlightRecord, NcclWarn

__all__ = ["KINDS", "NicError", "RankEvidence", "TrainingEvidence"]

KINDS = frozenset({CollectiveTimeout.KIND, CollectiveReport.KIND, NcclWarn.KIND, FlightRecord.KIND})


@dataclass(slots=True)
class RankEvidence:
    rank: int
    node: str
    gpu: int | None = None
    last_completed: int | None = None  # the highest collective sequence known completed
    completed_from: str = ""  # flight_recorder | work_status
    last_enqueued: int | None = None  # the highest collective sequence known enqueued (entered)
    timeout_seq: int | None = None
    timeout_at: float | None = None  # when the watchdog reported it
    started_at: float | None = None  # when the timed-out collective began (report time - ran)
    cuda_error: str | None = None
    cuda_at: float | None = None
    last_seen: float = 0.0

    @property
    def progress(self) -> int | None:
        """How far the rank got: its last completed collective; without one, the one before its timeout (a
        rank that timed out on an earlier collective than the others lags them)."""
        if self.last_completed is not None:
            return self.last_completed
        return None if self.timeout_seq is None else self.timeout_seq - 1


@dataclass(frozen=True, slots=True)
class NicError:
    time: float
    node: str
    gpu: int | None
    device: str | None
    status: int | None
    vendor_err: int | None


@dataclass(slots=True)
class _Node:
    nic: deque[NicError] = field(default_factory=lambda: deque(maxlen=64))
    cuda: deque[tuple[float, int | None, str]] = field(default_factory=lambda: deque(maxlen=16))
    last_seen: float = 0.0


class TrainingEvidence:
    def __init__(
        self,
        job_of: Callable[[str, int, float], str | None] = lambda node, gpu, now: None,
        *,
        ttl_s: float = 3600.0,
        max_jobs: int = 4096,
        max_ranks: int = 16384,
        max_nodes: int = 131_072,
    ) -> None:
        self._job_of = job_of
        self.ttl_s = ttl_s
        self.max_jobs = max_jobs
        self.max_ranks = max_ranks
        self.max_nodes = max_nodes
        self.jobs: dict[str, dict[int, RankEvidence]] = {}
        self.nodes: dict[str, _Node] = {}
        self.dropped = 0  # evidence refused by the bounds (counted with the fleet's evictions)

    # ------------------------------------------------------------------------------ observing

    def observe(self, e: Event) -> None:
        kind = e.kind
        if kind == CollectiveTimeout.KIND:
            t = CollectiveTimeout.read(e)
            if t is not None:
                r = self._rank(e, t.job, t.rank, t.gpu)
                if r is not None and (r.timeout_seq is None or t.seq >= r.timeout_seq):
                    r.timeout_seq, r.timeout_at = t.seq, e.time
                    r.started_at = e.time - max(0, t.ran_ms) / 1000.0
        elif kind == CollectiveReport.KIND:
            c = CollectiveReport.read(e)
            if c is None or c.rank is None:
                return
            if c.report == "work_status" and c.last_completed is not None:
                r = self._rank(e, c.job, c.rank, c.gpu)
                if r is not None:
                    self._completed(r, c.last_completed, "work_status")
                    self._enqueued(r, c.last_enqueued)
            elif c.report == "watchdog_exception" and c.detail and "CUDA error" in c.detail:
                r = self._rank(e, c.job, c.rank, c.gpu)
                if r is not None:
                    r.cuda_error, r.cuda_at = c.detail, e.time
                self._node(e.node, e.time).cuda.append((e.time, c.gpu, c.detail))
        elif kind == FlightRecord.KIND:
            f = FlightRecord.read(e)
            if f is not None:
                r = self._rank(e, f.job, f.rank, None)
                if r is not None and f.last_completed >= 0:
                    self._completed(r, f.last_completed, "flight_recorder")
                if r is not None and f.last_enqueued >= 0:
                    self._enqueued(r, f.last_enqueued)
        elif kind == NcclWarn.KIND:
            w = NcclWarn.read(e)
            if w is None:
                return
            if w.category in ("ib_completion", "ib_async"):
                self._node(e.node, e.time).nic.append(
                    NicError(e.time, e.node, w.gpu, w.device, w.status, w.vendor_err)
                )
            elif w.category == "cuda_failure":
                self._node(e.node, e.time).cuda.append((e.time, w.gpu, w.message))

    @staticmethod
    def _enqueued(r: RankEvidence, seq: int | None) -> None:
        if seq is not None and (r.last_enqueued is None or seq > r.last_enqueued):
            r.last_enqueued = seq

    @staticmethod
    def _completed(r: RankEvidence, seq: int, source: str) -> None:
        if r.last_completed is None or seq > r.last_completed:
            r.last_completed, r.completed_from = seq, source

    def _node(self, node: str, now: float) -> _Node:
        n = self.nodes.get(node)
        if n is None:
            while len(self.nodes) >= self.max_nodes:
                del self.nodes[next(iter(self.nodes))]
                self.dropped += 1
            n = self.nodes[node] = _Node()
        n.last_seen = now
        return n

    def _rank(self, e: Event, job: str | None, rank: int, gpu: int | None) -> RankEvidence | None:
        label = job_label(job) if job is not None else None
        if label is None and gpu is not None:
            label = self._job_of(e.node, gpu, e.time)
        if label is None:
            return None  # no job to attribute it to: it cannot place a rank in a wavefront
        ranks = self.jobs.get(label)
        if ranks is None:
            if len(self.jobs) >= self.max_jobs:
                self.dropped += 1
                return None
            ranks = self.jobs[label] = {}
        r = ranks.get(rank)
        if r is None:
            if len(ranks) >= self.max_ranks or rank < 0:
                self.dropped += 1
                return None
            r = ranks[rank] = RankEvidence(rank, e.node, gpu)
        r.node = e.node
        r.gpu = gpu if gpu is not None else r.gpu
        r.last_seen = max(r.last_seen, e.time)
        return r

    # ------------------------------------------------------------------------------ queries

    def ranks(self, job: str) -> list[RankEvidence]:
        return list(self.jobs.get(job, {}).values())

    def nic_errors(self, node: str, since: float, until: float) -> list[NicError]:
        n = self.nodes.get(node)
        return [x for x in n.nic if since <= x.time <= until] if n is not None else []

    def cuda_errors(self, node: str, since: float, until: float) -> list[tuple[float, int | None, str]]:
        n = self.nodes.get(node)
        return [x for x in n.cuda if since <= x[0] <= until] if n is not None else []

    def timeout_onset(self, job: str, since: float) -> float | None:
        """When the first collective that timed out in ``job`` began (None: no timeout since ``since``)."""
        starts = [
            r.started_at
            for r in self.jobs.get(job, {}).values()
            if r.started_at is not None and r.timeout_at is not None and r.timeout_at >= since
        ]
        return min(starts) if starts else None

    def prune(self, now: float) -> None:
        horizon = now - self.ttl_s
        for job in list(self.jobs):
            ranks = self.jobs[job]
            for rank in [k for k, r in ranks.items() if r.last_seen < horizon]:
                del ranks[rank]
            if not ranks:
                del self.jobs[job]
        for node in [k for k, n in self.nodes.items() if n.last_seen < horizon]:
            del self.nodes[node]
