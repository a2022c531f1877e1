"""Who a hung job's culprit is, evidence strongest first. Pure.

A hardware event on one of the job's nodes around the onset (or a GPU NVML reports lost); an application
Xid on one node; NET/IB completion errors on one node only (the NIC: hardware evidence); the odd GPUs out
(not spinning: idle, computing or silent) all on one node; a CUDA error the training stack reported on one
node; the ranks whose last completed collective lags the others' (the wavefront, from Flight Recorder dumps
and the watchdog's work-status lines); the rank whose collective sequence lags in its heartbeats; the rank
that entered the timed-out collective last. Without a culprit: the suspects, and the finding says so. (The
GPU that went quiet first is no evidence: in a hang every rank but the culprit reaches the collective and
spins; the first of them is the earliest to arrive, not the one that failed.)

Every finder is asked; the first that names a node is the culprit, and the others that name the same node
are listed in ``corroborated`` (those naming another node in ``contradicted``): the finding says which
evidence named the culprit and which confirmed it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from watchd.detect.fleet import FleetState
from watchd.detect.members import Member
from watchd.detect.params import HangParams
from watchd.detect.tracks import HardwareEvent, RankTrack
from watchd.detect.trainlog_evidence import RankEvidence, TrainingEvidence
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
    corroborated: tuple[str, ...] = ()  # other evidence naming the same node
    contradicted: tuple[str, ...] = ()  # other evidence naming another node


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


def _odd_one_out(ms: list[Member], onset: float) -> Culprit | None:
    """The GPUs that do not spin while the others do, all on one node. A GPU idle or computing counts only
    when its newest window lies (three quarters of it) after the onset: one whose window predates it (its
    agent's spin report or its next window still on the way) is not known yet to be odd."""
    odd = [
        m
        for m in ms
        if m.state in ("lost", "silent") or (m.state in ("idle", "compute") and _after(m, onset))
    ]
    if not odd or len(odd) * 2 >= len(ms):
        return None
    nodes = sorted({m.node for m in odd})
    states = ",".join(sorted({m.state for m in odd}))
    if len(nodes) == 1:
        gpu = odd[0].gpu if len(odd) == 1 else None
        what = f"{len(odd)} GPU(s) not spinning ({states}) while {len(ms) - len(odd)} spin"
        return Culprit(nodes[0], gpu, "odd_one_out", False, 0.85, what, tuple(nodes))
    return Culprit(None, None, "none", False, 0.3, f"GPUs not spinning on {len(nodes)} nodes", tuple(nodes))


def _after(m: Member, onset: float) -> bool:
    w = m.track.latest() if m.track is not None else None
    if w is None or m.track is None:
        return False
    ws = m.track.windows
    length = ws[-1].end - ws[-2].end if len(ws) >= 2 and ws[-1].end > ws[-2].end else 5.0
    return w.end - 0.75 * length >= onset


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


_FLUSH_ERR = 5


def _nic_errors(training: TrainingEvidence, job: JobView, since: float, now: float) -> Culprit | None:
    """NET/IB completion errors on exactly one of the job's nodes: its NIC (or its link) is the suspect.

    Flush errors (``status=5``, IBV_WC_WR_FLUSH_ERR) are left out: they follow a queue pair already in the
    error state, on both ends of the broken connection, and would point at the healthy peer as often."""
    by_node = {
        n: kept
        for n, errs in training.nic_errors(job.id, job.nodes, since, now).items()
        if (kept := [e for e in errs if e.status != _FLUSH_ERR])
    }
    if len(by_node) != 1:
        return None
    node, errs = next(iter(by_node.items()))
    devices = sorted({e.device for e in errs if e.device})
    gpus = {e.gpu for e in errs}
    statuses = sorted({e.status for e in errs if e.status is not None})
    vendor = sorted({e.vendor_err for e in errs if e.vendor_err is not None})
    what = (
        f"{len(errs)} NET/IB completion error(s)"
        + (f" on {','.join(devices)}" if devices else "")
        + (f", status {','.join(map(str, statuses))}" if statuses else "")
        + (f", vendor err {','.join(map(str, vendor))}" if vendor else "")
    )
    gpu = next(iter(gpus)) if len(gpus) == 1 else None
    return Culprit(node, gpu, "nic_errors", True, 0.9, what, (node,))


def _cuda_error(training: TrainingEvidence, job: JobView, since: float, now: float) -> Culprit | None:
    """A CUDA error reported by the training stack (NCCL ``Cuda failure``, the watchdog's CUDA exception) on
    one node only: not hardware evidence by itself (an illegal address is usually the program's)."""
    by_node = training.cuda_errors(job.id, job.nodes, since, now)
    if len(by_node) != 1:
        return None
    node, errs = next(iter(by_node.items()))
    gpus = {e.gpu for e in errs}
    gpu = next(iter(gpus)) if len(gpus) == 1 else None
    return Culprit(node, gpu, "cuda_error", False, 0.8, f"CUDA error: {errs[0].text[:160]}", (node,))


def _wavefront(evidence: list[RankEvidence]) -> Culprit | None:
    """The ranks whose progress lags everyone else's, all on one node: by the last collective completed,
    else by the last entered (a rank stuck before the collective the others wait in never enqueued it)."""
    for measure, verb in (
        (lambda r: r.progress, "completed"),
        (lambda r: r.last_enqueued, "entered"),
    ):
        found = _lagging(evidence, measure, verb)
        if found is not None:
            return found
    return None


def _lagging(
    evidence: list[RankEvidence], measure: Callable[[RankEvidence], int | None], verb: str
) -> Culprit | None:
    known = [(r, m) for r in evidence if (m := measure(r)) is not None]
    if len(known) < 2:
        return None
    low = min(m for _, m in known)
    lagging = [r for r, m in known if m == low]
    node = lagging[0].node
    if len(lagging) * 2 >= len(known) or len({r.node for r in lagging}) != 1 or node is None:
        return None  # lagging ranks on several nodes, or on a node nobody can tell
    ahead = min(m for _, m in known if m != low)
    r = lagging[0]
    sources = ",".join(sorted({x.completed_from or "timeout" for x in lagging}))
    what = (
        f"rank(s) {','.join(str(x.rank) for x in sorted(lagging, key=lambda x: x.rank)[:8])} {verb} "
        f"collective {low}, the others {ahead} or later ({sources})"
    )
    gpu = r.gpu if len(lagging) == 1 else None
    return Culprit(node, gpu, "wavefront", False, 0.85, what, (node,))


def _late_arrival(evidence: list[RankEvidence], margin_s: float = 5.0) -> Culprit | None:
    """Of the ranks that timed out on the same collective, the one that entered it last (the watchdog times a
    collective from its start, so the others, waiting longer, time out first), ``margin_s`` after the rest."""
    timed = [r for r in evidence if r.timeout_seq is not None and r.started_at is not None]
    if len(timed) < 3:
        return None
    seq = max(r.timeout_seq or 0 for r in timed)
    same = sorted((r for r in timed if r.timeout_seq == seq), key=lambda r: r.started_at or 0.0)
    if len(same) < 3 or (same[-1].started_at or 0.0) - (same[-2].started_at or 0.0) < margin_s:
        return None
    last = same[-1]
    if last.node is None:
        return None
    late = (last.started_at or 0.0) - (same[-2].started_at or 0.0)
    what = f"rank {last.rank} entered collective {seq} {late:.0f}s after the others"
    return Culprit(last.node, last.gpu, "late_arrival", False, 0.6, what, (last.node,))


def _same_nic(chosen: Culprit, training: TrainingEvidence, job: JobView, since: float, now: float) -> Culprit:
    """An InfiniBand port fault the agent saw, and NCCL's NET/IB errors on the same device of the same node:
    one NIC, said twice (the detail says so)."""
    if chosen.node is None or not chosen.detail.startswith("ib "):
        return chosen
    errors = training.nic_errors(job.id, job.nodes, since, now).get(chosen.node, [])
    same = sorted({e.device for e in errors if e.device and f"{e.device}:" in chosen.detail})
    if not same:
        return chosen
    return replace(chosen, detail=f"{chosen.detail}; NCCL NET/IB errors on {', '.join(same)} too")


def find_culprit(
    fleet: FleetState,
    job: JobView,
    ms: list[Member],
    ranks: list[RankTrack],
    onset: float,
    now: float,
    p: HangParams,
) -> Culprit:
    since = onset - p.culprit_lookback_s
    events = [h for node in job.nodes for h in fleet.hardware_events(node, since) if h.time <= now]
    for m in ms:
        if m.state == "lost":
            events.append(
                HardwareEvent(fleet.lost[(m.node, m.gpu)], m.node, m.gpu, "GPU lost", True, "gpu_lost")
            )
    training = fleet.training
    evidence = training.ranks(job.id, job.nodes)
    finders: tuple[Callable[[], Culprit | None], ...] = (
        lambda: _hardware_culprit(events, onset),
        lambda: _nic_errors(training, job, since, now),
        lambda: _odd_one_out(ms, onset),
        lambda: _cuda_error(training, job, since, now),
        lambda: _wavefront(evidence),
        lambda: _heartbeat_lag(ranks),
        lambda: _late_arrival(evidence),
    )
    named = [c for f in finders if (c := f()) is not None and c.node is not None]
    if named:
        chosen = _same_nic(named[0], training, job, since, now)
        agree = tuple(c.evidence for c in named[1:] if c.node == chosen.node)
        disagree = tuple(c.evidence for c in named[1:] if c.node != chosen.node)
        return replace(chosen, corroborated=agree, contradicted=disagree)
    suspects = tuple(sorted({m.node for m in ms if m.state != "spin"})) or job.nodes
    if ms and all(m.state == "spin" for m in ms):
        what = (
            "every GPU spins and no evidence names a node (a NIC, link or fabric fault shows in the nodes' "
            "InfiniBand port conditions or NCCL's NET/IB lines)"
        )
    else:
        what = "no odd one out"
    return Culprit(None, None, "none", False, 0.3, what, suspects)
