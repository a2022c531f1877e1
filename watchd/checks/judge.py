"""Judging a check's run (pure): the statuses every kind shares (time-out, not run, node failure), then the
kind's own judge (:data:`watchd.checks.kinds.CHECK_KINDS`); at a round's end, the comparison with the peers.
The verdict's evidence is one readable line (the drain reason of the default pack)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace

from watchd.checks.judges.nccl import baseline_for
from watchd.checks.kinds import CHECK_KINDS
from watchd.checks.params import Baseline, CheckSpec, PeersConfig
from watchd.checks.runner import RunOutput
from watchd.checks.verdict import Verdict, gbps, one_line
from watchd.model.events import Scalar

__all__ = ["Verdict", "baseline_for", "gbps", "judge", "judge_peers"]


def judge(spec: CheckSpec, node: str, run: RunOutput, baselines: Sequence[Baseline]) -> Verdict:
    """The verdict on one run. Never raises: an output that cannot be read is an ``error``."""
    figures: dict[str, Scalar] = {"exit_status": run.exit_code, "duration_s": run.duration_s}
    if run.status == "timeout":
        return Verdict("timeout", f"{spec.type} ran past its time limit of {spec.time_limit:g}s", figures)
    if run.status in ("not_started", "lost", "cancelled"):
        return Verdict("error", one_line(f"{spec.type} did not run: {run.status} {run.detail}"), figures)
    if run.status == "node_fail":
        return Verdict(
            "failed", one_line(f"{spec.type}: the node failed during the check ({run.detail})"), figures
        )
    if run.unread:  # not this job's output, or none could be read: no verdict on the node either way
        return Verdict("error", one_line(f"{spec.type}: {run.unread}"), figures)
    verdict = CHECK_KINDS[spec.type].judge(spec, node, run, baselines)
    return replace(verdict, figures={**figures, **verdict.figures})


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
