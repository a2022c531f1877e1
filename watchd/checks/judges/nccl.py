"""The ``nccl`` kind: nccl-tests ``all_reduce_perf`` on one node, its bus bandwidth at the largest size
compared with the configured baseline (the peers are compared at the round's end:
:func:`watchd.checks.judge.judge_peers`). The ``nccl-pair`` kind: the same program over two nodes, judged
against the baselines of ``scope: pair`` (the fabric between nodes); which node is at fault is decided by the
round (:mod:`watchd.checks.fabric`)."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import TYPE_CHECKING

from watchd.checks.parsers import parse_nccl
from watchd.checks.runner import RunOutput
from watchd.checks.verdict import Verdict, gbps, last_line, one_line
from watchd.model.events import Scalar

if TYPE_CHECKING:  # params imports the kinds table, which imports this module
    from watchd.checks.spec import BaselineView, SpecView

__all__ = [
    "NCCL_ARGV",
    "NCCL_PAIR_ARGV",
    "baseline_for",
    "judge_nccl",
    "judge_nccl_pair",
    "nccl_argv",
    "nccl_pair_argv",
]

#: one node, all 8 GPUs, 8 B to 8 GiB doubling (docs/checks.md: what the default baselines assume)
NCCL_ARGV = ("all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8")


#: two nodes, one process per GPU (nccl-tests built with MPI=1), launched by srun inside the check's job
NCCL_PAIR_ARGV = (
    "srun",
    "--ntasks-per-node=8",
    "all_reduce_perf",
    "-b",
    "8",
    "-e",
    "8G",
    "-f",
    "2",
    "-g",
    "1",
)


def nccl_argv(spec: SpecView) -> list[str]:
    return list(NCCL_ARGV)


def nccl_pair_argv(spec: SpecView) -> list[str]:
    return list(NCCL_PAIR_ARGV)


def baseline_for(
    spec: SpecView,
    node: str,
    gpu_model: str | None,
    baselines: Sequence[BaselineView],
    scope: str = "node",
) -> tuple[float, str] | None:
    if spec.baseline_gbps is not None:
        return spec.baseline_gbps, f"check {spec.name}"
    for b in baselines:
        if b.scope != scope:
            continue
        if b.gpu_model is not None and gpu_model is not None and b.gpu_model.lower() in gpu_model.lower():
            return b.busbw_gbps, f"config: {b.gpu_model}"
        if b.nodes and any(fnmatch.fnmatchcase(node, p) for p in b.nodes):
            return b.busbw_gbps, f"config: nodes {','.join(b.nodes)}"
    return None


def judge_nccl_pair(spec: SpecView, node: str, run: RunOutput, baselines: Sequence[BaselineView]) -> Verdict:
    """One 2-node run: as :func:`judge_nccl`, against the baselines of the fabric between nodes."""
    return judge_nccl(spec, node, run, baselines, scope="pair")


def judge_nccl(
    spec: SpecView, node: str, run: RunOutput, baselines: Sequence[BaselineView], scope: str = "node"
) -> Verdict:
    report = parse_nccl(run.output)
    # the largest size measured by a run that stopped early is no measurement of the links (its small sizes
    # read 0 GB/s): no figure then, never 0 GB/s in the event, the gauge or the peers' median
    busbw = report.busbw if report.complete else None
    figures: dict[str, Scalar] = {
        "busbw_gbps": busbw,
        "avg_busbw_gbps": report.avg_busbw,
        "sizes": report.sizes() or None,
        "wrong": report.wrong if report.rows else None,
        "gpu_model": report.gpu_model,
        "threshold": spec.threshold,
    }
    if report.errors:
        return Verdict("failed", one_line(f"nccl {report.errors[0].lstrip('#. ')}"), figures)
    if report.wrong:
        at = next(r.size for r in report.rows if r.wrong)
        return Verdict("failed", f"nccl #wrong {report.wrong} (first at {at} B)", figures)
    if report.out_of_bounds:
        return Verdict("failed", f"nccl out of bounds values {report.out_of_bounds}", figures)
    if not report.rows:
        if run.exit_code not in (None, 0):
            last = last_line(run.output)
            return Verdict(
                "failed", one_line(f"nccl exit status {run.exit_code}, no results: {last}"), figures
            )
        return Verdict(
            "error",
            "nccl printed no results" + (" (empty output)" if not run.output.strip() else ""),
            figures,
        )
    if not report.complete:
        if run.exit_code not in (None, 0):
            return Verdict(
                "failed",
                f"nccl exit status {run.exit_code} after {len(report.rows)} sizes (no summary)",
                figures,
            )
        return Verdict("error", f"nccl output truncated after {len(report.rows)} sizes (no summary)", figures)
    if run.exit_code not in (None, 0):
        return Verdict("failed", f"nccl exit status {run.exit_code}", figures)
    assert busbw is not None
    base = baseline_for(spec, node, report.gpu_model, baselines, scope)
    if base is not None:
        value, source = base
        figures.update(baseline_gbps=value, baseline_source=source)
        if busbw < spec.threshold * value:
            return Verdict(
                "failed",
                f"nccl busbw {gbps(busbw)} GB/s < {spec.threshold * 100:.0f}% of {gbps(value)} GB/s",
                figures,
            )
    return Verdict("passed", f"nccl busbw {gbps(busbw)} GB/s", figures)
