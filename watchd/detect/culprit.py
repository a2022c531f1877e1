"""Who a hung job's culprit is, evidence strongest first. Pure.

A hardware event on one of the job's nodes around the onset (or a GPU NVML reports lost); an application
Xid on one node; the odd GPUs out (not spinning: idle, computing or silent) all on one node; the rank whose
collective sequence lags; the first GPU to go quiet. Without a culprit: the suspects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from watchd.detect.fleet import FleetState, HardwareEvent, RankTrack
from watchd.detect.members import Member
from watchd.detect.params import HangParams
from watchd.jobs.topology import JobView


@dataclass(frozen=True, slots=True)
class Culprit:
    node: str | None
    gpu: int | None
    evidence: str
    hardware: bool
    confidence: float
    detail: str
    suspects: tuple[str, ...] = ()


def _hardware_culprit(events: list[HardwareEvent], onset: float) -> Culprit | None:
    hardware = [h for h in events if h.hardware]
    chosen = hardware or [h for h in events if not h.hardware]
    if not chosen:
        return None
    nodes = {h.node for h in chosen}
    # The event nearest the onset (before it, or the first after) marks the culprit.
    first = min(chosen, key=lambda h: abs(h.time - onset) if h.time <= onset else (h.time - onset) * 0.5)
    evidence = (
        "gpu_lost"
        if first.condition in ("gpu_lost", "RESTART_BM")
        else "nvlink_down"
        if "NVLINK" in first.condition.upper()
        else "hardware_event"
        if first.hardware
        else "app_xid"
    )
    confidence = (0.95 if first.hardware else 0.8) * (1.0 if len(nodes) == 1 else 0.7)
    return Culprit(
        first.node, first.gpu, evidence, first.hardware, confidence, first.what, tuple(sorted(nodes))
    )


def _odd_one_out(ms: list[Member]) -> Culprit | None:
    odd = [m for m in ms if m.state in ("idle", "compute", "silent", "lost")]
    if not odd or len(odd) * 2 >= len(ms):
        return None
    nodes = sorted({m.node for m in odd})
    states = ",".join(sorted({m.state for m in odd}))
    if len(nodes) == 1:
        gpu = odd[0].gpu if len(odd) == 1 else None
        what = f"{len(odd)} GPU(s) not spinning ({states}) while {len(ms) - len(odd)} spin"
        return Culprit(nodes[0], gpu, "odd_one_out", False, 0.85, what, tuple(nodes))
    return Culprit(None, None, "none", False, 0.3, f"GPUs not spinning on {len(nodes)} nodes", tuple(nodes))


def _heartbeat_lag(ranks: Iterable[RankTrack]) -> Culprit | None:
    ranks = [r for r in ranks if r.collective_seq is not None]
    if len(ranks) < 2:
        return None
    low = min(r.collective_seq or 0 for r in ranks)
    lagging = [r for r in ranks if r.collective_seq == low]
    if len(lagging) * 2 >= len(ranks) or len({r.node for r in lagging}) != 1:
        return None
    r = lagging[0]
    gpu = r.gpu if len(lagging) == 1 else None
    what = f"rank {r.rank} at collective {low}, the others ahead"
    return Culprit(r.node, gpu, "heartbeat_lag", False, 0.8, what, (r.node,))


def _first_quiet(ms: list[Member], spin_starts: dict[tuple[str, int], float]) -> Culprit | None:
    if len(spin_starts) < 2:
        return None
    ordered = sorted(spin_starts.items(), key=lambda kv: kv[1])
    (node, gpu), first = ordered[0]
    second = ordered[1][1]
    by_node = {k[0] for k, t in ordered if t == first}
    if second - first < 1.0 and len(by_node) != 1:
        return None
    gpus_first = [k for k, t in ordered if t == first]
    return Culprit(
        node,
        gpu if len(gpus_first) == 1 else None,
        "first_quiet",
        False,
        0.5,
        f"went quiet first, {second - first:.0f}s before the next",
        (node,),
    )


def find_culprit(
    fleet: FleetState,
    job: JobView,
    ms: list[Member],
    ranks: list[RankTrack],
    onset: float,
    now: float,
    p: HangParams,
    spin_starts: dict[tuple[str, int], float],
) -> Culprit:
    since = onset - p.culprit_lookback_s
    events = [h for node in job.nodes for h in fleet.hardware_events(node, since) if h.time <= now]
    for m in ms:
        if m.state == "lost":
            events.append(
                HardwareEvent(fleet.lost[(m.node, m.gpu)], m.node, m.gpu, "GPU lost", True, "gpu_lost")
            )
    finders: tuple[Callable[[], Culprit | None], ...] = (
        lambda: _hardware_culprit(events, onset),
        lambda: _odd_one_out(ms),
        lambda: _heartbeat_lag(ranks),
        lambda: _first_quiet(ms, spin_starts),
    )
    for finder in finders:
        found = finder()
        if found is not None and found.node is not None:
            return found
    suspects = tuple(sorted({m.node for m in ms if m.state != "spin"})) or job.nodes
    return Culprit(None, None, "none", False, 0.3, "no odd one out", suspects)
