"""MTBF with its uncertainty, from exposure (node-seconds in service) and failures.

The estimator: failures of a node are a Poisson process of constant rate (exponential times between
failures); over an exposure of ``T`` node-seconds with ``r`` failures the maximum-likelihood MTBF is
``T / r``. Its two-sided confidence interval at level ``1 - a`` (time-truncated observation) is exact:

    lower = 2T / chi2(1 - a/2, 2r + 2)        upper = 2T / chi2(a/2, 2r)

With no failure there is no point estimate and no upper bound: only the one-sided lower bound
``2T / chi2(1 - a, 2)`` (= ``T / ln(1/a)``). Few failures give a wide interval: that is the honest answer.

The chi-square quantiles are computed here (no SciPy): the degrees of freedom are always even, and the
chi-square distribution function is the regularized lower incomplete gamma function ``P(k/2, x/2)``, which is
evaluated by its series or its continued fraction (Numerical Recipes, 6.2) and inverted by bisection.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

__all__ = ["MtbfEstimate", "chi2_ppf", "gamma_p", "mtbf"]

_EPS = 1e-15
_ITMAX = 10_000


def gamma_p(a: float, x: float) -> float:
    """The regularized lower incomplete gamma function P(a, x), for a > 0 and x >= 0."""
    if a <= 0 or x < 0 or math.isnan(x):
        raise ValueError("gamma_p: needs a > 0 and x >= 0")
    if x == 0:
        return 0.0
    if math.isinf(x):
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:  # the series converges quickly
        term = total = 1.0 / a
        ap = a
        for _ in range(_ITMAX):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return min(1.0, total * math.exp(log_front))
    # the continued fraction for Q(a, x) (modified Lentz)
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, _ITMAX):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return max(0.0, 1.0 - math.exp(log_front) * h)


def chi2_cdf(x: float, df: int) -> float:
    return gamma_p(df / 2.0, x / 2.0)


@functools.lru_cache(maxsize=4096)  # a fleet's nodes share a few failure counts: one bisection per count
def chi2_ppf(p: float, df: int) -> float:
    """The ``p`` quantile of the chi-square distribution with ``df`` degrees of freedom (``0 < p < 1``)."""
    if not 0.0 < p < 1.0:
        raise ValueError("chi2_ppf: p must be in (0, 1)")
    if df < 1:
        raise ValueError("chi2_ppf: df must be >= 1")
    lo, hi = 0.0, max(1.0, float(df))
    while chi2_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if chi2_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True, slots=True)
class MtbfEstimate:
    """MTBF in seconds of exposure per failure. ``mtbf`` and ``upper`` are None without a failure (the data
    bound it only from below); ``lower`` is None without exposure."""

    exposure_s: float
    failures: int
    confidence: float
    mtbf: float | None
    lower: float | None
    upper: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "exposure_hours": round(self.exposure_s / 3600.0, 3),
            "failures": self.failures,
            "confidence": self.confidence,
            "mtbf_hours": _hours(self.mtbf),
            "mtbf_lower_hours": _hours(self.lower),
            "mtbf_upper_hours": _hours(self.upper),
        }


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 3600.0, 3)


def mtbf(exposure_s: float, failures: int, confidence: float = 0.9) -> MtbfEstimate:
    """The MTBF estimate and its ``confidence`` interval (two-sided; 0 failures: a one-sided lower bound)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be in (0, 1)")
    if failures < 0 or not math.isfinite(exposure_s) or exposure_s < 0:
        raise ValueError("exposure must be finite and >= 0, failures >= 0")
    alpha = 1.0 - confidence
    t2 = 2.0 * exposure_s
    if exposure_s == 0:
        return MtbfEstimate(0.0, failures, confidence, None, None, None)
    if failures == 0:
        return MtbfEstimate(exposure_s, 0, confidence, None, t2 / chi2_ppf(confidence, 2), None)
    return MtbfEstimate(
        exposure_s,
        failures,
        confidence,
        exposure_s / failures,
        t2 / chi2_ppf(1.0 - alpha / 2.0, 2 * failures + 2),
        t2 / chi2_ppf(alpha / 2.0, 2 * failures),
    )
