"""The usage report, pure: accounting records + fair-share rows + pending jobs + what watchd
observed -> one row per group (account, user, partition or a combination) for a window ``[start, end)``.

- GPU-hours: each run's GPUs x the part of ``[start, end or now]`` inside the window (``sacct -D``: every run
  of a requeued job is its own record and counts).
- Queue wait: ``start - submit`` of the runs that started in the window (p50/p95 by nearest rank, and max);
  the pending jobs' current waits (``now - submit``) with their reasons, separately.
- Share and fair-share: ``sshare``'s NormShares, EffectvUsage and LevelFS of the account association; the
  fair-share factor of an account row is the mean FairShare of its user associations (a user row: its own).
- Energy, observed and idle GPU-hours: what the agents reported per GPU for the job (``GpuUse``), given to the
  group of the job in accounting (else the group the engine knew when it observed it); a GPU-job whose
  observed span only partly overlaps the window counts in proportion.
- Lost GPU-hours: a run that ended with infrastructure evidence (state NODE_FAIL; watchd requeued it; watchd
  drained one of its nodes while it ran) lost its GPUs x the time since its last checkpoint (heartbeats in
  the ``checkpoint`` phase) inside the run, else since the run's start. Counted in the window of its end.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence

from watchd.reports.model import (
    DIMENSIONS,
    UNKNOWN,
    WAIT_EDGES_S,
    Accounting,
    Fault,
    GpuUse,
    JobRecord,
    LostJob,
    Observed,
    ShareRecord,
    UsageReport,
    UsageRow,
)

#: a drain or requeue by watchd counts as evidence for runs that ended up to this long after it
FAULT_GRACE_S = 120.0
_HEALTHY_END = frozenset({"COMPLETED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "PREEMPTED", "DEADLINE"})


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..1) of already sorted values; None when there are none."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _check_by(by: Sequence[str]) -> tuple[str, ...]:
    if not by:
        raise ValueError("group by at least one of: " + ", ".join(DIMENSIONS))
    bad = [d for d in by if d not in DIMENSIONS]
    if bad:
        raise ValueError(f"cannot group by {', '.join(bad)}: use {', '.join(DIMENSIONS)}")
    return tuple(dict.fromkeys(by))


def build_report(
    accounting: Accounting,
    observed: Observed,
    *,
    start: float,
    end: float,
    now: float,
    by: Sequence[str] = ("account",),
    idle_util_pct: float = 5.0,
    buckets: int = 14,
) -> UsageReport:
    """The report for ``[start, end)`` (``now``: the time of the accounting answer, for running and pending
    jobs). Raises ValueError for a bad ``by`` or an empty window."""
    dims = _check_by(by)
    if end <= start:
        raise ValueError("the report window is empty (end <= start)")
    rows: dict[tuple[str, ...], UsageRow] = {}

    def row(values: dict[str, str]) -> UsageRow:
        key = tuple(values.get(d) or UNKNOWN for d in dims)
        r = rows.get(key)
        if r is None:
            r = rows[key] = UsageRow(key=dict(zip(dims, key, strict=True)))
        return r

    width = (end - start) / max(1, buckets)
    bucket_starts = [start + i * width for i in range(max(1, buckets))]
    series: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(bucket_starts))
    waits: dict[tuple[str, ...], list[float]] = defaultdict(list)
    wait_hist: dict[str, list[int]] = defaultdict(lambda: [0] * (len(WAIT_EDGES_S) + 1))
    meta: dict[str, dict[str, str]] = {}
    total = 0.0

    for rec in accounting.jobs:
        values = {"account": rec.account, "user": rec.user, "partition": rec.partition}
        meta[rec.job_id] = values
        if rec.start is None:
            continue
        run_end = rec.end if rec.end is not None else now
        hours = rec.gpus * overlap(rec.start, run_end, start, end) / 3600.0
        started_here = start <= rec.start < end
        if hours <= 0 and not started_here:
            continue
        r = row(values)
        r.gpu_hours += hours
        total += hours
        if started_here:
            r.jobs += 1
            wait = max(0.0, rec.start - rec.submit)
            waits[tuple(r.key.values())].append(wait)
            wait_hist[rec.account][bisect.bisect_left(WAIT_EDGES_S, wait)] += 1
        if hours > 0 and rec.gpus:
            s = series[rec.account]
            first = max(0, int((max(rec.start, start) - start) // width))
            last = min(len(s) - 1, int((min(run_end, end) - start) // width))
            for i in range(first, last + 1):
                b0 = bucket_starts[i]
                s[i] += rec.gpus * overlap(rec.start, run_end, b0, b0 + width) / 3600.0

    for key, wait_list in waits.items():
        wait_list.sort()
        r = rows[key]
        r.waits_n = len(wait_list)
        r.wait_p50_s = percentile(wait_list, 0.5)
        r.wait_p95_s = percentile(wait_list, 0.95)
        r.wait_max_s = wait_list[-1]

    for p in accounting.pending:
        r = row({"account": p.account, "user": p.user, "partition": p.partition})
        r.pending += 1
        r.pending_gpus += p.gpus
        wait = max(0.0, now - p.submit)
        r.pending_wait_max_s = max(r.pending_wait_max_s or 0.0, wait)
        r.pending_reasons[p.reason] = r.pending_reasons.get(p.reason, 0) + 1

    _apply_shares(rows, dims, accounting.shares)
    _apply_observed(rows, row, meta, observed.gpus, start, end)
    lost = list(lost_work(accounting.jobs, observed, start, end))
    for lj in lost:
        r = row(meta.get(lj.job_id, {"account": lj.account}))
        r.lost_gpu_hours += lj.gpu_hours
        r.lost_jobs += 1
    for r in rows.values():
        r.usage_fraction = r.gpu_hours / total if total > 0 else 0.0

    ordered = sorted(rows.values(), key=lambda r: (-r.gpu_hours, tuple(r.key.values())))
    return UsageReport(
        start=start,
        end=end,
        by=dims,
        accounting=accounting.available,
        accounting_note=accounting.why,
        rows=ordered,
        total_gpu_hours=total,
        idle_util_pct=idle_util_pct,
        series=dict(series),
        bucket_starts=bucket_starts,
        wait_histograms=dict(wait_hist),
        lost_jobs=lost,
        pending=sorted(accounting.pending, key=lambda p: p.submit),
    )


def _apply_shares(
    rows: dict[tuple[str, ...], UsageRow], dims: tuple[str, ...], shares: Iterable[ShareRecord]
) -> None:
    if "partition" in dims and len(dims) == 1:
        return  # shares belong to accounts and users, not partitions
    accounts: dict[str, ShareRecord] = {}
    users: dict[tuple[str, str], ShareRecord] = {}
    factors: dict[str, list[float]] = defaultdict(list)
    for s in shares:
        if s.user is None:
            accounts[s.account] = s
        else:
            users[(s.account, s.user)] = s
            if s.fairshare is not None:
                factors[s.account].append(s.fairshare)
    for r in rows.values():
        account = r.key.get("account")
        if account is None:
            continue
        user = r.key.get("user")
        found = users.get((account, user)) if user is not None else accounts.get(account)
        if found is None:
            continue
        r.norm_shares = found.norm_shares
        r.effective_usage = found.effective_usage
        r.level_fs = found.level_fs
        if user is not None:
            r.fairshare = found.fairshare
        elif factors.get(account):
            r.fairshare = sum(factors[account]) / len(factors[account])


def _apply_observed(
    rows: dict[tuple[str, ...], UsageRow],
    row: Callable[[dict[str, str]], UsageRow],
    meta: dict[str, dict[str, str]],
    gpus: Iterable[GpuUse],
    start: float,
    end: float,
) -> None:
    for use in gpus:
        span = use.last - use.first
        if span > 0:
            part = overlap(use.first, use.last, start, end) / span
        else:
            part = 1.0 if start <= use.last < end else 0.0
        if part <= 0:
            continue
        values = meta.get(use.job) or {
            "account": use.account or UNKNOWN,
            "user": use.user or UNKNOWN,
            "partition": use.partition or UNKNOWN,
        }
        r = row(values)
        r.energy_kwh = (r.energy_kwh or 0.0) + part * use.energy_j / 3.6e6
        r.observed_gpu_hours = (r.observed_gpu_hours or 0.0) + part * use.gpu_s / 3600.0
        r.idle_gpu_hours = (r.idle_gpu_hours or 0.0) + part * use.idle_s / 3600.0


def lost_work(jobs: Iterable[JobRecord], observed: Observed, start: float, end: float) -> Iterable[LostJob]:
    """The runs that ended in ``[start, end)`` with infrastructure evidence, and the work each lost."""
    requeues: dict[str, list[float]] = defaultdict(list)
    drains: dict[str, list[float]] = defaultdict(list)
    for f in observed.faults:
        _index_fault(f, requeues, drains)
    for rec in jobs:
        if rec.start is None or rec.end is None or not (start <= rec.end < end):
            continue
        evidence = _evidence(rec, requeues, drains)
        if evidence is None:
            continue
        since, what = rec.start, "start"
        cps = observed.checkpoints.get(rec.job_id, ())
        i = bisect.bisect_right(cps, rec.end)
        if i and cps[i - 1] >= rec.start:
            since, what = cps[i - 1], "checkpoint"
        yield LostJob(
            job_id=rec.job_id,
            account=rec.account,
            gpus=rec.gpus,
            start=rec.start,
            end=rec.end,
            since=since,
            since_what=what,
            evidence=evidence,
            gpu_hours=rec.gpus * (rec.end - since) / 3600.0,
        )


def _index_fault(f: Fault, requeues: dict[str, list[float]], drains: dict[str, list[float]]) -> None:
    if f.kind == "requeue":
        for job in f.jobs:
            requeues[job].append(f.at)
    elif f.kind == "drain":
        drains[f.node].append(f.at)


def _evidence(rec: JobRecord, requeues: dict[str, list[float]], drains: dict[str, list[float]]) -> str | None:
    assert rec.start is not None and rec.end is not None
    if rec.state == "NODE_FAIL":
        return "node_fail"
    if any(rec.start <= t <= rec.end + FAULT_GRACE_S for t in requeues.get(rec.job_id, ())):
        return "requeue"
    if rec.state in _HEALTHY_END:
        return None
    for node in rec.nodes:
        if any(rec.start <= t <= rec.end + FAULT_GRACE_S for t in drains.get(node, ())):
            return "drain"
    return None


def shares_by_account(shares: Iterable[ShareRecord]) -> dict[str, ShareRecord]:
    return {s.account: s for s in shares if s.user is None}


def reasons_text(reasons: dict[str, int]) -> str:
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in Counter(reasons).most_common())
