"""Checkpoint intervals: Young's first-order optimum, Daly's higher-order one, and the share of compute lost.

Symbols (all seconds): ``C`` the time one checkpoint takes (the job stops computing meanwhile), ``M`` the
job's mean time between failures, ``R`` the restart time after a failure, ``tau`` the compute time between
checkpoints.

- Young (1974), "A first order approximation to the optimum checkpoint interval", CACM 17(9):
  ``tau = sqrt(2 C M)``.
- Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3),
  eq. (37): ``tau = sqrt(2 C M) [1 + 1/3 sqrt(C/(2M)) + 1/9 (C/(2M))] - C`` for ``C < 2M``, else ``M``.

A job on ``N`` nodes fails when any of them fails: with independent exponential failures the rates add, so
``M_job = M_node / N`` (:func:`job_mtbf`).

The share of compute lost (:func:`waste`) is Daly's complete model for exponential failures: the expected
wall time per ``tau`` of progress is ``M e^(R/M) (e^((tau + C)/M) - 1)``, so the share lost is
``1 - tau / (M e^(R/M) (e^((tau + C)/M) - 1))`` (checkpoints, re-done work and restarts together). Its
first-order form (:func:`waste_first_order`), ``C/tau + (tau + C)/(2M)``, is the cost Young minimised.
"""

from __future__ import annotations

import math

__all__ = ["daly", "job_mtbf", "waste", "waste_first_order", "young"]


def _check(c: float, m: float) -> None:
    if not (math.isfinite(c) and c > 0 and math.isfinite(m) and m > 0):
        raise ValueError("checkpoint cost and MTBF must be finite and > 0")


def young(c: float, m: float) -> float:
    """Young's interval ``sqrt(2 C M)``."""
    _check(c, m)
    return math.sqrt(2.0 * c * m)


def daly(c: float, m: float) -> float:
    """Daly's higher-order interval (2006, eq. 37): compute time between checkpoints."""
    _check(c, m)
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def job_mtbf(node_mtbf: float, nodes: int) -> float:
    """The MTBF of a job on ``nodes`` nodes that fail independently, each exponentially with ``node_mtbf``."""
    if nodes < 1:
        raise ValueError("a job runs on at least one node")
    return node_mtbf / nodes


def waste(c: float, tau: float, m: float, r: float = 0.0) -> float:
    """The expected share of wall time that is not progress at interval ``tau`` (Daly's exponential model)."""
    _check(c, m)
    if not (math.isfinite(tau) and tau > 0) or r < 0:
        raise ValueError("interval must be finite and > 0, restart >= 0")
    exponent = (tau + c) / m
    if exponent + r / m > 700.0:  # e^700: the job (practically) never gets a checkpoint done
        return 1.0
    wall = m * math.exp(r / m) * math.expm1(exponent)
    return min(1.0, max(0.0, 1.0 - tau / wall))


def waste_first_order(c: float, tau: float, m: float) -> float:
    """The first-order share lost, ``C/tau + (tau + C)/(2M)`` (small when ``tau, C << M``), at most 1."""
    _check(c, m)
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError("interval must be finite and > 0")
    return min(1.0, c / tau + (tau + c) / (2.0 * m))
