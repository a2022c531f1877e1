"""Heartbeats from training ranks: strict validation of a report, and the coalescer that turns reports into
``heartbeat`` events for the engine.

Pure: no I/O; the caller passes the arrival time and the clock. A rank reports every step (perhaps many times
a second); the engine needs only each rank's latest state, at most once per ``forward_interval_s``, and only
when it changed: a rank that falls silent is the signal of a hang, so nothing is sent for it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from watchd.clock import Clock
from watchd.model.events import Event, stable_id
from watchd.model.heartbeat import DEFAULT_PHASE, SOURCE, Heartbeat

#: reports further ahead of the agent's clock are refused (the engine refuses events 300 s ahead)
MAX_FUTURE_S = 60.0
MAX_JOB_LEN = 128
_PHASE = re.compile(r"[a-z_]{1,32}")
_MAX_INT = 2**63 - 1


class ReportError(ValueError):
    """A report that does not follow the wire format; the message names the field."""


@dataclass(frozen=True, slots=True)
class Report:
    job: str
    rank: int
    step: int
    time: float
    phase: str = DEFAULT_PHASE
    step_time_s: float | None = None
    compute_time_s: float | None = None
    collective_seq: int | None = None
    local_rank: int | None = None
    gpu: int | None = None

    def state(self) -> tuple[object, ...]:
        """What makes two reports different for the engine (the time alone does not)."""
        return (
            self.step,
            self.phase,
            self.step_time_s,
            self.compute_time_s,
            self.collective_seq,
            self.local_rank,
            self.gpu,
        )


_OPTIONAL = ("step_time_s", "compute_time_s", "collective_seq", "local_rank", "gpu")
_KEYS = frozenset({"job", "rank", "step", "time", "phase", *_OPTIONAL})


def _int(obj: dict[str, object], key: str, where: str, *, required: bool = False) -> int | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise ReportError(f"{where}{key}: required")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INT:
        raise ReportError(f"{where}{key}: expected an integer >= 0")
    return value


def _seconds(obj: dict[str, object], key: str, where: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ReportError(f"{where}{key}: expected a number >= 0")
    return float(value)


def parse_report(obj: object, arrival: float, where: str = "") -> Report:
    """Validate one decoded report; ``arrival`` (epoch seconds) is its time when it carries none."""
    if not isinstance(obj, dict):
        raise ReportError(f"{where or 'body'}: expected a JSON object")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise ReportError(f"{where}{unknown[0]}: unknown field (known: {', '.join(sorted(_KEYS))})")
    job = obj.get("job")
    if not isinstance(job, str) or not job:
        raise ReportError(f"{where}job: required, a non-empty string")
    if len(job) > MAX_JOB_LEN or not job.isprintable():
        raise ReportError(f"{where}job: at most {MAX_JOB_LEN} printable characters")
    phase = obj.get("phase", DEFAULT_PHASE)
    if not isinstance(phase, str) or not _PHASE.fullmatch(phase):
        raise ReportError(f"{where}phase: expected 1 to 32 characters of a-z and _")
    when = _seconds(obj, "time", where)
    if when is None:
        when = arrival
    elif when > arrival + MAX_FUTURE_S:
        raise ReportError(f"{where}time: more than {MAX_FUTURE_S:g} s ahead of the node's clock")
    rank = _int(obj, "rank", where, required=True)
    step = _int(obj, "step", where, required=True)
    assert rank is not None and step is not None
    return Report(
        job=job,
        rank=rank,
        step=step,
        time=when,
        phase=phase,
        step_time_s=_seconds(obj, "step_time_s", where),
        compute_time_s=_seconds(obj, "compute_time_s", where),
        collective_seq=_int(obj, "collective_seq", where),
        local_rank=_int(obj, "local_rank", where),
        gpu=_int(obj, "gpu", where),
    )


def parse_reports(body: object, arrival: float, max_reports: int) -> list[Report]:
    """A report or a list of them; all valid or ReportError naming the first problem."""
    if isinstance(body, list):
        if not body:
            raise ReportError("body: an empty list")
        if len(body) > max_reports:
            raise ReportError(f"body: {len(body)} reports in one request, at most {max_reports}")
        return [parse_report(item, arrival, f"[{i}].") for i, item in enumerate(body)]
    return [parse_report(body, arrival)]


@dataclass(slots=True)
class _Rank:
    latest: Report
    seen: float  # monotonic time of the latest report
    reports: int = 1  # reports since the last forward
    forwarded: tuple[object, ...] | None = None  # state of the last forward
    forwarded_at: float = -math.inf
    forwarded_phase: str | None = None
    owner: str | None = None  # the verified job (or pod) the rank is charged to

    @property
    def changed(self) -> bool:
        return self.latest.state() != self.forwarded


@dataclass
class Coalescer:
    """Each rank's latest report, forwarded as one event at most once per ``forward_interval_s``, only when
    it changed; a phase change (and a rank's first report) is forwarded at once."""

    node: str
    clock: Clock
    forward_interval_s: float = 2.0
    max_ranks: int = 1024
    forget_after_s: float = 600.0
    #: ranks one verified job (or pod) may hold, so that no job crowds out another's (None: no cap)
    max_ranks_per_job: int | None = None
    _ranks: dict[tuple[str, int], _Rank] = field(default_factory=dict)
    _per_owner: dict[str | None, int] = field(default_factory=dict)
    _pending: set[tuple[str, int]] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self._ranks)

    def offer(self, report: Report, owner: str | None = None) -> list[Event] | None:
        """Record a report of ``owner`` (the verified job or pod); the events to ship now, or None when
        refused (``max_ranks`` ranks tracked, ``owner`` holds ``max_ranks_per_job``, or the rank is another
        owner's)."""
        key = (report.job, report.rank)
        now = self.clock.monotonic()
        rank = self._ranks.get(key)
        if rank is None:
            if len(self._ranks) >= self.max_ranks:
                return None
            held = self._per_owner.get(owner, 0)
            if self.max_ranks_per_job is not None and held >= self.max_ranks_per_job:
                return None
            rank = self._ranks[key] = _Rank(report, now, owner=owner)
            self._per_owner[owner] = held + 1
        elif rank.owner != owner:
            return None  # a rank is its first verified owner's until it finishes or falls silent
        else:
            rank.latest = report
            rank.seen = now
            rank.reports += 1
        if not rank.changed:
            return []
        if rank.forwarded_phase != report.phase or now - rank.forwarded_at >= self.forward_interval_s:
            return [self._forward(key, rank, now)]
        self._pending.add(key)
        return []

    def due(self) -> list[Event]:
        """Events whose interval has passed since their rank's last forward; forgets long-silent ranks."""
        now = self.clock.monotonic()
        events = []
        for key in list(self._pending):
            rank = self._ranks[key]
            if not rank.changed:
                self._pending.discard(key)
            elif now - rank.forwarded_at >= self.forward_interval_s:
                events.append(self._forward(key, rank, now))
        silent = [k for k, r in self._ranks.items() if now - r.seen >= self.forget_after_s]
        for key in silent:
            self._drop(key)
        return events

    def _forward(self, key: tuple[str, int], rank: _Rank, now: float) -> Event:
        report = rank.latest
        event = heartbeat_event(self.node, report, rank.reports)
        rank.forwarded = report.state()
        rank.forwarded_at = now
        rank.forwarded_phase = report.phase
        rank.reports = 0
        self._pending.discard(key)
        if report.phase == "done":
            self._drop(key)  # the rank finished: its slot is free for the next job's ranks
        return event

    def _drop(self, key: tuple[str, int]) -> None:
        rank = self._ranks.pop(key)
        self._pending.discard(key)
        left = self._per_owner.get(rank.owner, 1) - 1
        if left > 0:
            self._per_owner[rank.owner] = left
        else:
            self._per_owner.pop(rank.owner, None)


def heartbeat_event(node: str, report: Report, reports: int) -> Event:
    return Heartbeat(
        job=report.job,
        rank=report.rank,
        step=report.step,
        step_time_s=report.step_time_s,
        compute_time_s=report.compute_time_s,
        collective_seq=report.collective_seq,
        local_rank=report.local_rank,
        gpu=report.gpu,
        phase=report.phase,
        reports=reports,
    ).to_event(
        id=stable_id(node, SOURCE, report.job, report.rank, report.step, report.phase, report.collective_seq),
        node=node,
        source=SOURCE,
        time=report.time,
    )
