"""Safety decisions before any disruptive action (pure: state in, verdict out, ``now`` passed in).

- Blast-radius breaker: within a sliding window, watchd may take out of service at most ``max_fraction``
  of a pool (a Slurm partition) and at most ``max_nodes`` of it. Beyond that, disruptive actions are held
  for an operator; detection, alerts and resumes go on.
- Per-rule rate limit: at most ``max`` disruptive actions by one rule within ``per``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BreakerLimits:
    max_fraction: float = 0.10
    max_nodes: int = 50
    window_s: float = 3600.0

    def allowed_in(self, pool_size: int) -> int:
        """How many nodes of a pool of this size may be out of service (by watchd) in one window.

        A pool of unknown size (the scheduler could not be asked yet, or a node in no known pool) allows
        one: with no way to tell 10% from 100%, the breaker fails safe."""
        if pool_size <= 0:
            return 1
        return max(1, min(self.max_nodes, math.floor(pool_size * self.max_fraction)))


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reason: str = ""
    pool: str = ""


def breaker_verdict(
    node: str,
    pools_of_node: Sequence[str],
    pool_sizes: Mapping[str, int],
    taken: Mapping[str, int],
    counted: Mapping[str, bool],
    limits: BreakerLimits,
) -> Verdict:
    """May ``node`` be taken out now? ``taken``: per pool, how many nodes watchd disrupted within the window;
    ``counted``: per pool, whether ``node`` is one of them (a node already counted does not count twice:
    draining it again changes nothing)."""
    for pool in pools_of_node or ("all",):
        if counted.get(pool, False):
            continue
        n = taken.get(pool, 0)
        size = pool_sizes.get(pool, 0)
        allowed = limits.allowed_in(size)
        if n + 1 > allowed:
            share = f"{n} of {size}" if size else f"{n}"
            return Verdict(
                False,
                f"blast-radius breaker: {share} nodes of pool {pool} already taken out by watchd within "
                f"{limits.window_s:g} s (limit {allowed}: {limits.max_fraction:.0%}, "
                f"at most {limits.max_nodes})",
                pool,
            )
    return Verdict(True)


def rate_verdict(rule: str, times: Iterable[float], now: float, max_actions: int, per_s: float) -> Verdict:
    """``times``: when this rule's earlier disruptive actions were taken."""
    return rate_verdict_counted(rule, sum(1 for t in times if now - t < per_s), max_actions, per_s)


def rate_verdict_counted(rule: str, within: int, max_actions: int, per_s: float) -> Verdict:
    """``within``: how many disruptive actions this rule took within the last ``per_s``."""
    if within >= max_actions:
        return Verdict(
            False,
            f"rate limit of rule {rule}: {within} disruptive actions within {per_s:g} s (max {max_actions})",
        )
    return Verdict(True)


Gate = Callable[[], Verdict]


class SafetyGate:
    """A safety check to run at the last moment; remembers its verdict (the pool that held the action)."""

    def __init__(self, check: Gate) -> None:
        self._check = check
        self.verdict: Verdict | None = None

    def __call__(self) -> Verdict:
        self.verdict = self._check()
        return self.verdict
