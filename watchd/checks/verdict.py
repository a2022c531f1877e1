"""A check's verdict (pure): its outcome, one readable line of evidence (the drain reason of the default
pack) and the figures measured on the way, and the helpers every kind's judge writes its evidence with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from watchd.model.events import Scalar

__all__ = ["NOT_CHECKED", "Verdict", "gbps", "last_line", "one_line", "tag", "validation_reason"]

_MAX_EVIDENCE = 300
#: a validation's pair check found no partner to run with: the links were not checked (never a failure)
NOT_CHECKED = "not_checked"


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: str  # passed | failed | timeout | error | not_checked
    evidence: str
    figures: Mapping[str, Scalar] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    @property
    def busbw(self) -> float | None:
        v = self.figures.get("busbw_gbps")
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def tag(check: str, figures: Mapping[str, Scalar]) -> str:
    """A failed check in a few characters, as a drain reason for it starts (``sinfo -R`` shows 12 characters
    after ``watchd: ``): ``nccl #wrong 3``, ``nccl 312GB/s``, ``dcgm pcie,memory``, ``NAME failed``. The
    default pack's check-failed rule writes the same from the event's figures."""
    wrong, busbw, failed = figures.get("wrong"), figures.get("busbw_gbps"), figures.get("failed_tests")
    if isinstance(wrong, int | float) and not isinstance(wrong, bool) and wrong:
        return f"{check} #wrong {wrong:g}"
    if isinstance(busbw, int | float) and not isinstance(busbw, bool):
        return f"{check} {round(busbw)}GB/s"
    if isinstance(failed, str) and failed:
        return f"{check} {failed}"
    return f"{check} failed"


def validation_reason(failed: list[tuple[str, str]], not_checked: list[tuple[str, str]]) -> str:
    """The drain reason a validation leaves: its evidence first, in the 12 characters ``sinfo -R`` shows
    after ``watchd: `` (the failed checks' tags, else ``NAME not checked``), then ``(validate)`` and the
    whole evidence. ``failed``, ``not_checked``: (tag or check name, evidence) of each; "" when both are
    empty."""
    if failed:
        tags, evidence = [t for t, _ in failed], [e for _, e in failed + not_checked]
        return f"{', '.join(tags)} (validate): {'; '.join(evidence)}"
    if not_checked:
        names = ", ".join(n for n, _ in not_checked)
        why = "; ".join(e for _, e in not_checked)
        return f"{names} not checked (validate): {why}; tried again when a partner frees up"
    return ""


def gbps(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def one_line(text: str) -> str:
    """``text`` on one line, blanks collapsed, cut to the length of a drain reason."""
    return " ".join(text.split())[:_MAX_EVIDENCE]


def last_line(output: str) -> str:
    """The last non-blank line of a tool's output, as :func:`one_line`."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return one_line(lines[-1]) if lines else ""
