"""The ``check_result`` kind: the outcome of one active check (nccl-tests, ``dcgmi diag``, a site's
command) on one node, judged against its baseline and its peers (:mod:`watchd.checks`).

On the checked node; ``source`` ``watchd:checks``. ``outcome``: ``passed``; ``failed`` (the tool ran and
found the node wanting: low bandwidth, ``#wrong`` values, a failed diagnostic, a crash); ``timeout`` (it ran
past its time limit); ``error`` (it could not be run or its output could not be read: the node is not
blamed, the check is retried with back-off); ``link`` (``nccl-pair``: the node and ``partners`` ran slowly
together, each fine with others: the link between them, not either node); ``not_checked`` (a validation's
pair check found no idle known-good partner: the links were not checked, the node is not blamed; with
``overdue`` true and ``waited_s``, it has waited ``checks.partner_wait`` for one). ``evidence`` is one
line, the drain reason of the default pack (``nccl busbw 312 GB/s < 80% of 450 GB/s``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from watchd.model.events import Scalar
from watchd.model.kinds import Attrs

__all__ = ["KIND", "OUTCOMES", "SOURCE", "CheckResult"]

KIND = "check_result"
SOURCE = "watchd:checks"
OUTCOMES = ("passed", "failed", "timeout", "error", "link", "not_checked")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult(Attrs):
    KIND: ClassVar[str] = KIND

    check: str  # the configured check's name
    check_type: str  # nccl | dcgm-diag | command
    passed: bool
    outcome: str  # one of OUTCOMES
    evidence: str  # one readable line
    round: str = ""  # the round (check@scheduled time) or "validate:<id>" / "run:<id>"
    validation: bool = False  # part of `watchd node validate`
    busbw_gbps: float | None = None  # nccl: bus bandwidth at the largest size
    avg_busbw_gbps: float | None = None  # nccl: "# Avg bus bandwidth"
    sizes: str | None = None  # nccl: "size:busbw,..." of the largest sizes
    wrong: int | None = None  # nccl: #wrong values
    baseline_gbps: float | None = None  # what busbw was compared with
    baseline_source: str | None = None  # "config: <gpu model or nodes>" | "peers"
    threshold: float | None = None  # the share of the baseline a node must reach
    peers_median_gbps: float | None = None
    peers: int | None = None
    gpu_model: str | None = None
    partners: str | None = None  # nccl-pair: the nodes it ran with (comma-separated)
    failed_tests: str | None = None  # dcgm-diag: comma-separated
    warned_tests: str | None = None
    skipped_tests: str | None = None
    dcgm_version: str | None = None
    exit_status: int | None = None
    duration_s: float | None = None
    job: str | None = None  # the scheduler's job (Slurm job id, Kubernetes Job name)
    overdue: bool | None = None  # not_checked: waited checks.partner_wait for a partner (the page)
    waited_s: float | None = None  # not_checked: how long it has waited for one
    extra: Mapping[str, Scalar] = field(default_factory=dict)
