"""The detector interface: one condition of a job, judged from the fleet state at one time.

A detector is pure: what it returns depends only on the fleet, the job, the time and its own parameters
(no I/O, no clock, no memory between cycles). It says what it sees as :data:`Sighting` values; the
correlator remembers what was already reported (:mod:`watchd.detect.episodes`) and decides what to report.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

from watchd.detect.finding import Finding
from watchd.detect.fleet import FleetState
from watchd.detect.params import DetectorParams
from watchd.jobs.topology import JobView

P = TypeVar("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Onset:
    """A condition established with its onset (the detector already waited its own ``for_s``): reported at
    once, then again, as the next revision, each time its finding grows stronger."""

    key: tuple[str, ...]  # which condition of the job: the same key in a later cycle is the same episode
    finding: Finding  # revision 0


@dataclass(frozen=True, slots=True)
class Persisting:
    """A condition seen now whose onset is when it was first seen: reported once it held ``for_s``, then
    every ``every_s``. ``finding(onset, revision)`` is called only when a report is due (it may be costly);
    None: not worth reporting this time."""

    key: tuple[str, ...]
    for_s: float
    every_s: float
    finding: Callable[[float, int], Finding | None]


Sighting = Onset | Persisting


@dataclass(slots=True)
class Cycle:
    """One pass of the detectors over the fleet at ``now``, job after job. What several jobs read is computed
    once per pass (:meth:`once`); what several detectors of one job read, once per job
    (:meth:`once_for_job`)."""

    fleet: FleetState
    now: float
    defaults: DetectorParams  # the top-level parameters: for references taken across the whole fleet
    _memo: dict[Hashable, object] = field(default_factory=dict)
    _job: str | None = None
    _job_memo: dict[Hashable, object] = field(default_factory=dict)

    def once(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, the first time ``key`` is asked for in this pass; the same value afterwards."""
        if key not in self._memo:
            self._memo[key] = compute()
        return cast(T, self._memo[key])

    def keep(self, key: Hashable, value: object) -> None:
        """What :meth:`once` answers for ``key`` in this pass (computed beforehand, in steps)."""
        self._memo[key] = value

    def once_for_job(self, job: JobView, key: Hashable, compute: Callable[[], T]) -> T:
        """:meth:`once` for the job being judged. Kept only until the next job: held for the whole pass,
        thousands of per-GPU objects would outlive the young garbage generation and cost full collections."""
        if job.id != self._job:
            self._job, self._job_memo = job.id, {}
        if key not in self._job_memo:
            self._job_memo[key] = compute()
        return cast(T, self._job_memo[key])


class Detector(Protocol[P]):
    """One signal, one condition per job (gpud style: one component per signal, registered in one list)."""

    name: str

    def params(self, of: DetectorParams) -> P:
        """Its own parameters, from those in force for a job's partition."""
        ...

    def judge(self, cycle: Cycle, job: JobView, params: P) -> Sequence[Sighting]:
        """What holds in ``job`` at ``cycle.now``; empty when the job is fine by this detector."""
        ...


AnyDetector = Detector[Any]


@runtime_checkable
class Prepares(Protocol):
    """A detector that reads something across the whole fleet (not one job) has it computed once per cycle,
    before the jobs are judged, in steps: a yield between pages (:mod:`watchd.slices`), kept with
    :meth:`Cycle.keep`. Optional: most detectors need nothing of the kind."""

    def prepare(self, cycle: Cycle) -> Iterator[None]: ...
