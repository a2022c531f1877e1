"""Nodes as a scheduler reports them, and watchd's drain-safety policy over them: what every scheduler
integration decides the same way before it touches a node (drain only nodes in service, resume only nodes
watchd drained, recognized by the reason prefix)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

DrainOutcome = Literal["drained", "already_drained", "skipped", "failed", "held"]
ResumeOutcome = Literal["resumed", "not_drained", "refused", "failed"]
RebootOutcome = Literal["rebooting", "not_drained", "refused", "failed"]
#: the flags of a node whose reboot was asked for and has not completed (Slurm's names)
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})

WATCHD_REASON_PREFIX = "watchd:"


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    state: str  # base state, lower case: idle, allocated, mixed, down, unknown, ...
    flags: frozenset[str] = frozenset()  # upper case: DRAIN, NOT_RESPONDING, ...
    reason: str | None = None
    #: tells one boot of the node from the next, where the scheduler says (Slurm: its BootTime; Kubernetes:
    #: the node's bootID): a reboot is over when it changed and no reboot is pending
    boot_id: str | None = None

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def reboot_pending(self) -> bool:
        """A reboot was asked for and the node has not come back from it yet."""
        return bool(self.flags & REBOOT_FLAGS)

    @property
    def down(self) -> bool:
        return self.state in ("down", "fail") or "FAIL" in self.flags


@dataclass(frozen=True, slots=True)
class DrainResult:
    node: str
    outcome: DrainOutcome
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ResumeResult:
    node: str
    outcome: ResumeOutcome
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RebootResult:
    node: str
    outcome: RebootOutcome
    detail: str = ""
    boot_id: str | None = None  # the boot the node was in when the reboot was asked (``rebooting``)


def drain_reason(reason: str, prefix: str = WATCHD_REASON_PREFIX) -> str:
    """The reason as the scheduler will show it: one line, starting with watchd's prefix."""
    reason = " ".join(reason.split())  # one line: scontrol and sinfo -R show a single line
    return reason if reason.startswith(prefix) else f"{prefix} {reason}"


def describe(st: NodeState) -> str:
    """A node's state as scontrol shows it, e.g. ``IDLE+DRAIN``."""
    return "+".join([st.state.upper(), *sorted(st.flags)])


def drained_by_watchd(st: NodeState, prefix: str = WATCHD_REASON_PREFIX) -> bool:
    return st.drained and st.reason is not None and st.reason.startswith(prefix)


def down_by_watchd(st: NodeState, prefix: str = WATCHD_REASON_PREFIX) -> bool:
    """Down, not drained, for watchd's reason: how Slurm brings back a node watchd had rebooted
    (``nextstate=DOWN``)."""
    return st.down and not st.drained and st.reason is not None and st.reason.startswith(prefix)


def plan_drain(
    reasons: Mapping[str, str], states: Mapping[str, NodeState], prefix: str = WATCHD_REASON_PREFIX
) -> tuple[dict[str, DrainResult], dict[str, list[str]]]:
    """The safety decision every scheduler shares, before it touches anything.

    Returns the nodes settled without a change (unknown, already drained by watchd, or drained or down for
    someone else's reason: never touched) and the nodes to drain, grouped by their final reason."""
    settled: dict[str, DrainResult] = {}
    groups: dict[str, list[str]] = {}
    for node, reason in reasons.items():
        st = states.get(node)
        if st is None or drained_by_watchd(st, prefix):
            settled[node] = left_as_is(node, st)
        elif down_by_watchd(st, prefix):  # back from a reboot watchd asked for: drained again, as it was
            groups.setdefault(drain_reason(reason, prefix), []).append(node)
        elif st.drained or st.down:
            settled[node] = DrainResult(
                node, "skipped", f"node is {describe(st)} for reason {st.reason!r}, not set by watchd"
            )
        else:
            groups.setdefault(drain_reason(reason, prefix), []).append(node)
    return settled, groups


def left_as_is(node: str, st: NodeState | None) -> DrainResult:
    """A drain of a node unknown to the scheduler (``failed``) or that watchd drained already there."""
    if st is None:
        return DrainResult(node, "failed", "unknown node")
    return DrainResult(node, "already_drained", st.reason or "")


def refuse_resume(st: NodeState | None, node: str, prefix: str = WATCHD_REASON_PREFIX) -> ResumeResult | None:
    """Why a node must not be resumed by watchd, or None when it may (watchd drained it)."""
    if st is None:
        return ResumeResult(node, "failed", "unknown node")
    if not st.drained:
        return ResumeResult(node, "not_drained", describe(st))
    if not drained_by_watchd(st, prefix):
        return ResumeResult(node, "refused", f"drained by someone else: {st.reason!r}")
    return None


def refuse_reboot(st: NodeState | None, node: str, prefix: str = WATCHD_REASON_PREFIX) -> RebootResult | None:
    """Why watchd must not reboot a node, or None when it may: only a node watchd took out of service (its
    drain's reason carries watchd's prefix), so no job of anyone's is started on it meanwhile."""
    if st is None:
        return RebootResult(node, "failed", "unknown node")
    if not st.drained:
        return RebootResult(node, "not_drained", describe(st))
    if not drained_by_watchd(st, prefix):
        return RebootResult(node, "refused", f"drained by someone else: {st.reason!r}")
    return None
