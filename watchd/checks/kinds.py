"""The check kinds, one row each: what a check's ``type:`` may name, the program it runs unless the check
gives its own ``command``, the judge that parses and judges its output, and the figures that judge may put
in a verdict. Those figures, and only those, are carried into the ``check_result`` event
(:class:`watchd.model.check.CheckResult` declares a field for each: tests/checks/test_kinds.py holds every
kind's judge to its declaration and the declaration to the event).

Adding a kind: its parser (``parsers/``) and judge (``judges/<kind>.py``), one row below, a field in
``model/check.py`` for each new figure, fields in ``params.py`` for parameters of its own
(docs/architecture.md, "To add X"). A site's own program needs no kind: ``type: command`` is configuration
only."""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from watchd.checks.judges.command import judge_exit_status
from watchd.checks.judges.dcgm import dcgm_argv, judge_dcgm
from watchd.checks.judges.nccl import judge_nccl, judge_nccl_pair, nccl_argv, nccl_pair_argv
from watchd.checks.runner import RunOutput
from watchd.checks.verdict import Verdict
from watchd.model.events import Scalar

if TYPE_CHECKING:  # params validates ``type:`` against this table
    from watchd.checks.spec import BaselineView, SpecView

__all__ = [
    "ALL_FIGURES",
    "CHECK_KINDS",
    "COMMON_FIGURES",
    "PEER_FIGURES",
    "CheckKind",
    "DefaultArgv",
    "Judge",
    "undeclared_figures",
]

#: (the check, the node, what the run gave, the configured baselines) -> the verdict
Judge = Callable[["SpecView", str, RunOutput, Sequence["BaselineView"]], Verdict]
#: the program and its arguments from the check's parameters
DefaultArgv = Callable[["SpecView"], list[str]]

#: every kind's verdict carries what the run cost (:func:`watchd.checks.judge.judge` adds them)
COMMON_FIGURES: tuple[str, ...] = ("exit_status", "duration_s")
#: what all_reduce_perf's judge puts in a verdict, on one node or across nodes
NCCL_FIGURES: tuple[str, ...] = (
    "busbw_gbps",
    "avg_busbw_gbps",
    "sizes",
    "wrong",
    "gpu_model",
    "threshold",
    "baseline_gbps",
    "baseline_source",
)
#: what the comparison with the peers adds to a verdict with a bus bandwidth (``judge_peers``)
PEER_FIGURES: tuple[str, ...] = ("peers_median_gbps", "peers", "baseline_source")


@dataclass(frozen=True, slots=True)
class CheckKind:
    name: str  # what a check's ``type:`` says
    default_argv: DefaultArgv | None  # None: every check of this kind gives its ``command``
    judge: Judge
    figures: tuple[str, ...]  # what ``judge`` may put in a verdict, besides COMMON_FIGURES
    nodes_per_run: int = 1  # 2: one job over a pair of nodes, judged by the round (watchd.checks.fabric)

    @property
    def carried(self) -> tuple[str, ...]:
        """The figures a ``check_result`` of this kind carries (the common ones first)."""
        return tuple(dict.fromkeys((*COMMON_FIGURES, *self.figures)))

    def argv(self, spec: SpecView) -> list[str]:
        """The check's own ``command``, else this kind's default; ValueError when there is neither."""
        if spec.command:
            return list(spec.command)
        if self.default_argv is None:
            raise ValueError(f"check {spec.name}: type {self.name} needs a command")
        return self.default_argv(spec)


def _table(*kinds: CheckKind) -> Mapping[str, CheckKind]:
    table: dict[str, CheckKind] = {}
    for kind in kinds:
        if kind.name in table:
            raise ValueError(f"check kind {kind.name!r} twice")
        table[kind.name] = kind
    return types.MappingProxyType(table)


CHECK_KINDS: Mapping[str, CheckKind] = _table(
    CheckKind(
        "nccl",
        default_argv=nccl_argv,
        judge=judge_nccl,
        figures=(*NCCL_FIGURES, *PEER_FIGURES),
    ),
    CheckKind(
        "nccl-pair",
        default_argv=nccl_pair_argv,
        judge=judge_nccl_pair,
        figures=(*NCCL_FIGURES, "partners"),
        nodes_per_run=2,
    ),
    CheckKind(
        "dcgm-diag",
        default_argv=dcgm_argv,
        judge=judge_dcgm,
        figures=("failed_tests", "warned_tests", "skipped_tests", "dcgm_version"),
    ),
    CheckKind("command", default_argv=None, judge=judge_exit_status, figures=()),
)

#: every figure some kind carries, each once
ALL_FIGURES: tuple[str, ...] = tuple(dict.fromkeys(f for k in CHECK_KINDS.values() for f in k.carried))


def undeclared_figures(kind: CheckKind, figures: Mapping[str, Scalar]) -> list[str]:
    """The figures in a verdict that ``kind`` does not declare (they would not reach the event)."""
    carried = set(kind.carried)
    return sorted(f for f in figures if f not in carried)
