"""A job's GPUs as the hang and host-stall detectors see them: each one's state in the newest window, how long
a state has held, and whether the job declared a quiet phase. Pure.

Both detectors classify the same GPUs with the hang parameters in one cycle: :func:`job_members` does it
once per job and cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from watchd.detect.detector import Cycle
from watchd.detect.fleet import QUIET_PHASES, FleetState
from watchd.detect.params import HangParams
from watchd.detect.spins import Spin
from watchd.detect.tracks import GpuTrack, RankTrack, Window, median
from watchd.jobs.topology import JobView

GpuState = Literal["spin", "idle", "compute", "silent", "lost", "unknown"]
_SILENT_WINDOWS = 3.0  # a GPU whose newest window is older than this many windows has gone quiet
QUIET_VALID_S = 60.0  # a declared pause counts while its rank reported within this long


def is_spin(w: Window, track: GpuTrack, p: HangParams) -> bool:
    if w.util is None or w.util < p.spin_util or w.power is None or track.power_base is None:
        return False
    if w.power > p.spin_power_ratio * track.power_base:
        return False
    return w.link is None or track.link_base is None or w.link <= p.spin_link_ratio * track.link_base


def gpu_state(
    fleet: FleetState,
    track: GpuTrack | None,
    node: str,
    gpu: int,
    now: float,
    p: HangParams,
    spin: Spin | None,
) -> GpuState:
    """``spin``: the GPU's spin as its agent reports it (:meth:`FleetState.spin_of` at ``now``)."""
    if (node, gpu) in fleet.lost:
        return "lost"
    if spin is not None:
        return "spin"  # its agent saw the signature within the last samples: fresher than any window
    if track is None or not track.windows:
        return "silent"
    w = track.windows[-1]
    if now - w.end > _SILENT_WINDOWS * _window_s(track):
        return "silent"
    if w.util is None:
        return "unknown"
    if is_spin(w, track, p):
        return "spin"
    if w.util <= 10.0:
        return "idle"
    return "compute" if w.util >= 50.0 else "unknown"


def _window_s(track: GpuTrack) -> float:
    ws = track.windows
    return ws[-1].end - ws[-2].end if len(ws) >= 2 and ws[-1].end > ws[-2].end else 5.0


def run_start(track: GpuTrack, holds: Callable[[Window], bool]) -> float | None:
    """When the GPU's newest run of windows for which ``holds`` is true began (its first window's start)."""
    start: float | None = None
    previous_end: float | None = None
    window_s = _window_s(track)
    for w in reversed(track.windows):
        if not holds(w):
            break
        if previous_end is not None and previous_end - w.end > 2.5 * window_s:
            break  # a gap in the history ends the run
        start = w.end - window_s
        previous_end = w.end
    return start


def sustained_since(starts: Sequence[float | None], need: int) -> float | None:
    """The time since which at least ``need`` of the GPUs hold (the need-th earliest run start)."""
    known = sorted(s for s in starts if s is not None)
    if need < 1 or len(known) < need:
        return None
    return known[need - 1]


@dataclass(frozen=True, slots=True)
class Member:
    node: str
    gpu: int
    track: GpuTrack | None
    state: GpuState
    spin: Spin | None = None  # its agent's report, where it says the GPU spins (read once per cycle)


def members(fleet: FleetState, job: JobView, now: float, p: HangParams) -> list[Member]:
    out = []
    for node in job.nodes:
        for gpu in job.gpus.get(node, ()):
            track = fleet.gpus.get((node, gpu))
            spin = fleet.spin_of(node, gpu, now) if fleet.spinning else None
            out.append(Member(node, gpu, track, gpu_state(fleet, track, node, gpu, now, p, spin), spin))
    return out


def job_members(cycle: Cycle, job: JobView, p: HangParams) -> list[Member]:
    """:func:`members`, computed once per job and cycle (``p`` is the job's partition's, the same for every
    detector that asks)."""
    return cycle.once_for_job(job, "members", lambda: members(cycle.fleet, job, cycle.now, p))


def warmed_up(ms: Sequence[Member], p: HangParams) -> bool:
    """The job's GPUs computed for ``warmup_s`` (the median GPU): only then is it judged on NVML."""
    tracks = [m.track for m in ms if m.track is not None]
    return bool(tracks) and median([t.computed_s for t in tracks]) >= p.warmup_s


def quiet_declared(ranks: Iterable[RankTrack], now: float) -> bool:
    """A quiet phase (checkpoint, eval, ...) declared recently: a rank that went silent after declaring one
    does not hide a hang that follows it for long."""
    return any(r.phase in QUIET_PHASES and now - r.last_report <= QUIET_VALID_S for r in ranks)


def job_ranks(fleet: FleetState, job: JobView) -> list[RankTrack]:
    return list(fleet.ranks.get(job.id, {}).values())
