"""Judging a check's output (pure): what the tool printed, the baseline and the peers -> a verdict whose
evidence is one readable line (the drain reason of the default pack)."""

from __future__ import annotations

import fnmatch
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from watchd.checks.params import Baseline, CheckSpec, PeersConfig
from watchd.checks.parsers import parse_dcgm, parse_nccl
from watchd.checks.runner import RunOutput
from watchd.model.events import Scalar

__all__ = ["Verdict", "baseline_for", "gbps", "judge", "judge_peers"]

_MAX_EVIDENCE = 300


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: str  # passed | failed | timeout | error
    evidence: str
    figures: Mapping[str, Scalar] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    @property
    def busbw(self) -> float | None:
        v = self.figures.get("busbw_gbps")
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def gbps(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def _line(text: str) -> str:
    return " ".join(text.split())[:_MAX_EVIDENCE]


def _last_line(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return _line(lines[-1]) if lines else ""


def baseline_for(
    spec: CheckSpec, node: str, gpu_model: str | None, baselines: Sequence[Baseline]
) -> tuple[float, str] | None:
    if spec.baseline_gbps is not None:
        return spec.baseline_gbps, f"check {spec.name}"
    for b in baselines:
        if b.gpu_model is not None and gpu_model is not None and b.gpu_model.lower() in gpu_model.lower():
            return b.busbw_gbps, f"config: {b.gpu_model}"
        if b.nodes and any(fnmatch.fnmatchcase(node, p) for p in b.nodes):
            return b.busbw_gbps, f"config: nodes {','.join(b.nodes)}"
    return None


def judge(spec: CheckSpec, node: str, run: RunOutput, baselines: Sequence[Baseline]) -> Verdict:
    """The verdict on one run. Never raises: an output that cannot be read is an ``error``."""
    figures: dict[str, Scalar] = {"exit_status": run.exit_code, "duration_s": run.duration_s}
    if run.status == "timeout":
        return Verdict("timeout", f"{spec.type} ran past its time limit of {spec.time_limit:g}s", figures)
    if run.status in ("not_started", "lost", "cancelled"):
        return Verdict("error", _line(f"{spec.type} did not run: {run.status} {run.detail}"), figures)
    if run.status == "node_fail":
        return Verdict(
            "failed", _line(f"{spec.type}: the node failed during the check ({run.detail})"), figures
        )
    if spec.type == "nccl":
        return _judge_nccl(spec, node, run, baselines, figures)
    if spec.type == "dcgm-diag":
        return _judge_dcgm(spec, run, figures)
    if run.exit_code == 0:
        return Verdict("passed", f"{spec.name}: exit status 0", figures)
    last = _last_line(run.output)
    return Verdict(
        "failed", _line(f"{spec.name}: exit status {run.exit_code}" + (f": {last}" if last else "")), figures
    )


def _judge_nccl(
    spec: CheckSpec, node: str, run: RunOutput, baselines: Sequence[Baseline], figures: dict[str, Scalar]
) -> Verdict:
    report = parse_nccl(run.output)
    busbw = report.busbw
    figures.update(
        busbw_gbps=busbw,
        avg_busbw_gbps=report.avg_busbw,
        sizes=report.sizes() or None,
        wrong=report.wrong if report.rows else None,
        gpu_model=report.gpu_model,
        threshold=spec.threshold,
    )
    if report.errors:
        return Verdict("failed", _line(f"nccl {report.errors[0].lstrip('#. ')}"), figures)
    if report.wrong:
        at = next(r.size for r in report.rows if r.wrong)
        return Verdict("failed", f"nccl #wrong {report.wrong} (first at {at} B)", figures)
    if report.out_of_bounds:
        return Verdict("failed", f"nccl out of bounds values {report.out_of_bounds}", figures)
    if not report.rows:
        if run.exit_code not in (None, 0):
            last = _last_line(run.output)
            return Verdict("failed", _line(f"nccl exit status {run.exit_code}, no results: {last}"), figures)
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
    base = baseline_for(spec, node, report.gpu_model, baselines)
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


def _judge_dcgm(spec: CheckSpec, run: RunOutput, figures: dict[str, Scalar]) -> Verdict:
    report = parse_dcgm(run.output)
    failed = [t for t in report.tests if t.status == "fail"]
    warned = [t for t in report.tests if t.status == "warn"]
    skipped = [t for t in report.tests if t.status == "skip"]
    figures.update(
        failed_tests=",".join(t.name for t in failed) or None,
        warned_tests=",".join(t.name for t in warned) or None,
        skipped_tests=",".join(t.name for t in skipped) or None,
        dcgm_version=report.version,
    )
    if failed:
        first = failed[0]
        why = next((m for m in first.messages if m and not m.startswith("info:")), "")
        names = ", ".join(t.name for t in failed)
        return Verdict(
            "failed",
            _line(f"dcgm diag -r {spec.level} failed: {names}" + (f" ({why})" if why else "")),
            figures,
        )
    if report.errors:
        return Verdict("failed", _line(f"dcgm diag: {report.errors[0]}"), figures)
    if warned and spec.fail_on_warn:
        return Verdict(
            "failed", _line(f"dcgm diag -r {spec.level} warned: {', '.join(t.name for t in warned)}"), figures
        )
    if not report.tests:
        if run.exit_code not in (None, 0):
            return Verdict(
                "failed", _line(f"dcgm diag exit status {run.exit_code}: {_last_line(run.output)}"), figures
            )
        return Verdict("error", "dcgm diag printed no results", figures)
    passed = sum(t.status == "pass" for t in report.tests)
    note = f", {len(skipped)} skipped" if skipped else ""
    note += f", {len(warned)} warned" if warned else ""
    return Verdict("passed", f"dcgm diag -r {spec.level}: {passed} passed{note}", figures)


def judge_peers(
    verdicts: Mapping[str, Verdict], peers: PeersConfig, threshold_label: str = ""
) -> dict[str, Verdict]:
    """The nodes of one round (one check) whose bus bandwidth is below ``peers.share`` of the median of the
    nodes with the same GPU model: their verdicts, turned to ``failed``. Only verdicts not failed already."""
    if not peers.enabled:
        return {}
    groups: dict[str, list[tuple[str, float]]] = {}
    for node, v in verdicts.items():
        bw = v.busbw
        if bw is not None and v.outcome in ("passed", "failed"):
            groups.setdefault(str(v.figures.get("gpu_model") or ""), []).append((node, bw))
    out: dict[str, Verdict] = {}
    for members in groups.values():
        if len(members) < peers.min_nodes:
            continue
        median = statistics.median(bw for _, bw in members)
        for node, bw in members:
            v = verdicts[node]
            figures = {**v.figures, "peers_median_gbps": median, "peers": len(members)}
            if v.outcome == "passed" and bw < peers.share * median:
                out[node] = replace(
                    v,
                    outcome="failed",
                    evidence=f"nccl busbw {gbps(bw)} GB/s < {peers.share * 100:.0f}% of peers' median "
                    f"{gbps(median)} GB/s ({len(members)} nodes)",
                    figures={**figures, "baseline_source": "peers"},
                )
            else:
                out[node] = replace(v, figures=figures)
    return out
