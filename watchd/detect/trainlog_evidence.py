"""What the training stack said about each job, kept for the hang detector. Pure.

Fed the training-log kinds (:mod:`watchd.model.trainlog`) by :class:`~watchd.detect.fleet.FleetState`:

* per job and rank: the last collective known completed (Flight Recorder dumps, the watchdog's work-status
  line), the collective it timed out on, when that collective began (report time minus how long it ran) and
  a CUDA error it reported;
* per node: NET/IB completion errors (with the NIC where the line names it) and CUDA failures.

Which node a piece of evidence is about (:mod:`watchd.detect.attribution`): a line from a node's own log (a
pod's log, a unit's journal, a Flight Recorder dump) is its reporter's. A line read from a Slurm job's output
file (``gathered``: one file collects what every task of the job printed, on all its nodes, and only the
agent on the job's batch host reads it) is the node's it names — NCCL's ``host:pid:tid`` prefix, or its rank
placed on a node by the rank's own evidence (heartbeats, Flight Recorder dumps, a line naming both) — and
otherwise the job's only node; in a multi-node job a line that names no node of the job is nobody's.

Bounded whatever the input: at most ``max_jobs`` jobs and ``max_ranks`` ranks per job (the evidence of a new
rank beyond it is dropped and counted), 64 NIC and 16 CUDA errors per node, at most ``max_nodes`` nodes;
everything older than ``ttl_s`` is pruned. A line without a job (a journald unit, a plain file) still counts
for its node, and for the job running on its GPU when it names one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from watchd.detect.attribution import Origin, Placement, credit
from watchd.model.events import Event
from watchd.model.jobs import job_label
from watchd.model.trainlog import CollectiveReport, CollectiveTimeout, FlightRecord, NcclWarn

__all__ = ["KINDS", "CudaError", "NicError", "RankEvidence", "TrainingEvidence"]

KINDS = frozenset({CollectiveTimeout.KIND, CollectiveReport.KIND, NcclWarn.KIND, FlightRecord.KIND})


@dataclass(slots=True)
class RankEvidence:
    rank: int
    node: str | None  # the node it ran on, where known (see :meth:`TrainingEvidence.ranks`)
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
    host: str | None = None  # the host a gathered line of this rank named
    reporter: str = ""  # the node whose agent read its gathered lines (the job's batch host)

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
    origin: Origin
    gpu: int | None
    device: str | None
    status: int | None
    vendor_err: int | None


@dataclass(frozen=True, slots=True)
class CudaError:
    time: float
    origin: Origin
    gpu: int | None
    text: str


_E = TypeVar("_E", NicError, CudaError)


@dataclass(slots=True)
class _Lines:
    """NIC and CUDA errors of one node (its own lines) or of one job (lines gathered from its output)."""

    nic: deque[NicError] = field(default_factory=lambda: deque(maxlen=64))
    cuda: deque[CudaError] = field(default_factory=lambda: deque(maxlen=16))
    last_seen: float = 0.0


class TrainingEvidence:
    def __init__(
        self,
        job_of: Callable[[str, int, float], str | None] = lambda node, gpu, now: None,
        *,
        rank_node: Callable[[str, int], str | None] = lambda job, rank: None,
        ttl_s: float = 3600.0,
        max_jobs: int = 4096,
        max_ranks: int = 16384,
        max_nodes: int = 131_072,
    ) -> None:
        self._job_of = job_of
        self._rank_node = rank_node  # where a rank's heartbeats come from
        self.ttl_s = ttl_s
        self.max_jobs = max_jobs
        self.max_ranks = max_ranks
        self.max_nodes = max_nodes
        self.jobs: dict[str, dict[int, RankEvidence]] = {}
        self.nodes: dict[str, _Lines] = {}  # a node's own lines
        self.gathered: dict[str, _Lines] = {}  # job -> the lines of its output file
        self.dropped = 0  # evidence refused by the bounds (counted with the fleet's evictions)
        self._handlers = self.subscriptions()

    # ------------------------------------------------------------------------------ observing

    def subscriptions(self) -> dict[str, Callable[[Event], None]]:
        """The training stack's kinds, each with its handler."""
        return {
            CollectiveTimeout.KIND: self._timeout,
            CollectiveReport.KIND: self._report,
            FlightRecord.KIND: self._flight_record,
            NcclWarn.KIND: self._nccl_warn,
        }

    def observe(self, e: Event) -> None:
        """One event of any kind (what the fleet's dispatch does with :meth:`subscriptions`)."""
        handler = self._handlers.get(e.kind)
        if handler is not None:
            handler(e)

    def _timeout(self, e: Event) -> None:
        t = CollectiveTimeout.read(e)
        if t is not None:
            r = self._rank(e, t.job, t.rank, t.gpu, bool(t.gathered))
            if r is not None and (r.timeout_seq is None or t.seq >= r.timeout_seq):
                r.timeout_seq, r.timeout_at = t.seq, e.time
                r.started_at = e.time - max(0, t.ran_ms) / 1000.0

    def _report(self, e: Event) -> None:
        c = CollectiveReport.read(e)
        if c is None or c.rank is None:
            return
        gathered = bool(c.gathered)
        if c.report == "work_status" and c.last_completed is not None:
            r = self._rank(e, c.job, c.rank, c.gpu, gathered)
            if r is not None:
                self._completed(r, c.last_completed, "work_status")
                self._enqueued(r, c.last_enqueued)
        elif c.report == "watchdog_exception" and c.detail and "CUDA error" in c.detail:
            r = self._rank(e, c.job, c.rank, c.gpu, gathered)
            if r is not None:
                r.cuda_error, r.cuda_at = c.detail, e.time
            lines = self._lines(e, c.job, gathered)
            if lines is not None:
                origin = Origin(e.node, gathered, None, c.rank)
                lines.cuda.append(CudaError(e.time, origin, c.gpu, c.detail))

    def _flight_record(self, e: Event) -> None:
        f = FlightRecord.read(e)
        if f is not None:
            r = self._rank(e, f.job, f.rank, None, False)  # a dump is read where its rank wrote it
            if r is not None and f.last_completed >= 0:
                self._completed(r, f.last_completed, "flight_recorder")
            if r is not None and f.last_enqueued >= 0:
                self._enqueued(r, f.last_enqueued)

    def _nccl_warn(self, e: Event) -> None:
        w = NcclWarn.read(e)
        if w is None:
            return
        gathered = bool(w.gathered)
        if w.rank is not None and w.host is not None:
            self._rank(e, w.job, w.rank, w.gpu, gathered, host=w.host)  # places the rank on its host
        if w.category not in ("ib_completion", "ib_async", "cuda_failure"):
            return
        lines = self._lines(e, w.job, gathered)
        if lines is None:
            return
        origin = Origin(e.node, gathered, w.host, w.rank)
        if w.category == "cuda_failure":
            lines.cuda.append(CudaError(e.time, origin, w.gpu, w.message))
        else:
            lines.nic.append(NicError(e.time, origin, w.gpu, w.device, w.status, w.vendor_err))

    @staticmethod
    def _enqueued(r: RankEvidence, seq: int | None) -> None:
        if seq is not None and (r.last_enqueued is None or seq > r.last_enqueued):
            r.last_enqueued = seq

    @staticmethod
    def _completed(r: RankEvidence, seq: int, source: str) -> None:
        if r.last_completed is None or seq > r.last_completed:
            r.last_completed, r.completed_from = seq, source

    def _lines(self, e: Event, job: str | None, gathered: bool) -> _Lines | None:
        """Where a NIC or CUDA error is kept: with its job when read from the job's gathered output, else
        with the node that read it."""
        if not gathered:
            return self._keep(self.nodes, e.node, e.time, self.max_nodes)
        label = job_label(job) if job is not None else None
        if label is None:
            self.dropped += 1  # gathered from a job's output, yet no job: nobody's
            return None
        return self._keep(self.gathered, label, e.time, self.max_jobs)

    def _keep(self, table: dict[str, _Lines], key: str, now: float, bound: int) -> _Lines:
        n = table.get(key)
        if n is None:
            while len(table) >= bound:
                del table[next(iter(table))]
                self.dropped += 1
            n = table[key] = _Lines()
        n.last_seen = now
        return n

    def _rank(
        self,
        e: Event,
        job: str | None,
        rank: int,
        gpu: int | None,
        gathered: bool,
        *,
        host: str | None = None,
    ) -> RankEvidence | None:
        label = job_label(job) if job is not None else None
        if label is None and gpu is not None and not gathered:
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
            r = ranks[rank] = RankEvidence(rank, None)
        if not gathered:
            r.node = e.node  # the rank's own node said it
            r.gpu = gpu if gpu is not None else r.gpu
        else:
            r.reporter = e.node
            r.host = host if host is not None else r.host
        r.last_seen = max(r.last_seen, e.time)
        return r

    # ------------------------------------------------------------------------------ queries

    def placement(self, job: str) -> Placement:
        """Where each rank of ``job`` runs, as far as known: its own node's evidence (heartbeats, a line or
        dump its node read), else the host a gathered line of it named."""
        ranks = self.jobs.get(job, {})

        def placed(rank: int) -> str | None:
            r = ranks.get(rank)
            if r is not None and r.node is not None:
                return r.node
            node = self._rank_node(job, rank)
            if node is not None:
                return node
            return r.host if r is not None else None

        return placed

    def ranks(self, job: str, nodes: Sequence[str] = ()) -> list[RankEvidence]:
        """The evidence of each rank of ``job`` (on ``nodes``), each with the node it ran on where known."""
        placed = self.placement(job)
        out = []
        for r in self.jobs.get(job, {}).values():
            node = r.node
            if node is None and nodes:
                node = credit(Origin(r.reporter, True, None, r.rank), nodes, placed)
            out.append(r if node == r.node else replace(r, node=node))
        return out

    def nic_errors(
        self, job: str, nodes: Sequence[str], since: float, until: float
    ) -> dict[str, list[NicError]]:
        """The NET/IB errors between ``since`` and ``until`` on each node of ``job``: the nodes' own lines and
        the job's gathered lines credited to them."""
        return self._by_node(job, nodes, since, until, lambda lines: lines.nic)

    def cuda_errors(
        self, job: str, nodes: Sequence[str], since: float, until: float
    ) -> dict[str, list[CudaError]]:
        """The CUDA errors between ``since`` and ``until``, by node of ``job`` (as :meth:`nic_errors`)."""
        return self._by_node(job, nodes, since, until, lambda lines: lines.cuda)

    def _by_node(
        self,
        job: str,
        nodes: Sequence[str],
        since: float,
        until: float,
        of: Callable[[_Lines], deque[_E]],
    ) -> dict[str, list[_E]]:
        out: dict[str, list[_E]] = {}
        for node in nodes:
            own = self.nodes.get(node)
            if own is not None:
                found = [x for x in of(own) if since <= x.time <= until]
                if found:
                    out[node] = found
        gathered = self.gathered.get(job)
        if gathered is not None:
            placed = self.placement(job)
            for x in of(gathered):
                if since <= x.time <= until:
                    credited = credit(x.origin, nodes, placed)
                    if credited is not None:
                        out.setdefault(credited, []).append(x)
        return out

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
        for table in (self.nodes, self.gathered):
            for key in [k for k, n in table.items() if n.last_seen < horizon]:
                del table[key]
