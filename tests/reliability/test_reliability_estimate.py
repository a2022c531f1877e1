"""The MTBF estimator and its exact chi-square interval (watchd.reliability.estimate)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchd.reliability.estimate import chi2_ppf, gamma_p, mtbf

# Chi-square critical values from the NIST/SEMATECH e-Handbook of Statistical Methods, table 1.3.6.7.4
# ("Critical values of the chi-square distribution"): (p, df) -> the p quantile.
TABLE = {
    (0.95, 2): 5.991,
    (0.05, 2): 0.103,
    (0.975, 10): 20.483,
    (0.025, 10): 3.247,
    (0.95, 22): 33.924,
    (0.99, 1): 6.635,
    (0.90, 100): 118.498,
}


@pytest.mark.parametrize(("p", "df"), sorted(TABLE))
def test_chi2_quantiles_match_the_table(p: float, df: int) -> None:
    assert chi2_ppf(p, df) == pytest.approx(TABLE[(p, df)], abs=1e-3)


@given(st.floats(0.001, 0.999))
def test_chi2_with_two_degrees_of_freedom_has_a_closed_form(p: float) -> None:
    # chi2 with 2 df is exponential with mean 2: F(x) = 1 - exp(-x/2)
    assert chi2_ppf(p, 2) == pytest.approx(-2.0 * math.log1p(-p), rel=1e-9)


@given(st.integers(1, 60), st.floats(0.0, 200.0))
def test_gamma_p_of_an_integer_is_one_minus_the_poisson_distribution(k: int, x: float) -> None:
    poisson_cdf = sum(math.exp(-x + i * math.log(x) - math.lgamma(i + 1)) for i in range(k)) if x > 0 else 1.0
    assert gamma_p(k, x) == pytest.approx(1.0 - poisson_cdf, abs=1e-9)


def test_zero_failures_give_only_a_lower_bound() -> None:
    est = mtbf(1000 * 3600.0, 0, confidence=0.9)
    assert est.mtbf is None and est.upper is None
    # 2T / chi2(0.9, 2) = T / ln(1/0.1)
    assert est.lower == pytest.approx(1000 * 3600.0 / math.log(10.0))


def test_no_exposure_gives_no_estimate() -> None:
    est = mtbf(0.0, 0)
    assert (est.mtbf, est.lower, est.upper) == (None, None, None)


def test_a_worked_interval() -> None:
    # 3 failures in 1000 h at 90%: lower = 2000 / chi2(0.95, 8) = 2000 / 15.507,
    # upper = 2000 / chi2(0.05, 6) = 2000 / 1.635 (table values, as above)
    est = mtbf(1000 * 3600.0, 3, confidence=0.9)
    assert est.mtbf == pytest.approx(1000 * 3600.0 / 3)
    assert est.lower is not None and est.upper is not None
    assert est.lower / 3600 == pytest.approx(2000 / 15.507, rel=1e-3)
    assert est.upper / 3600 == pytest.approx(2000 / 1.635, rel=1e-3)


@given(st.floats(1.0, 1e9), st.integers(1, 500), st.floats(0.5, 0.99))
def test_the_interval_brackets_the_estimate(exposure: float, failures: int, confidence: float) -> None:
    est = mtbf(exposure, failures, confidence)
    assert est.lower is not None and est.mtbf is not None and est.upper is not None
    assert 0 < est.lower < est.mtbf < est.upper


@given(st.floats(1.0, 1e8), st.integers(0, 200), st.floats(1.5, 100.0))
def test_it_scales_with_exposure(exposure: float, failures: int, factor: float) -> None:
    a, b = mtbf(exposure, failures), mtbf(exposure * factor, failures)
    assert a.lower is not None and b.lower is not None
    assert b.lower == pytest.approx(a.lower * factor, rel=1e-6)
    if failures:
        assert a.mtbf is not None and b.mtbf is not None and a.upper is not None and b.upper is not None
        assert b.mtbf == pytest.approx(a.mtbf * factor, rel=1e-9)
        assert b.upper == pytest.approx(a.upper * factor, rel=1e-6)


@given(st.floats(100.0, 1e8), st.integers(1, 200))
def test_more_confidence_is_a_wider_interval_and_more_failures_a_narrower_one(
    exposure: float, r: int
) -> None:
    narrow, wide = mtbf(exposure, r, 0.8), mtbf(exposure, r, 0.99)
    assert wide.lower is not None and narrow.lower is not None and wide.upper is not None
    assert narrow.upper is not None
    assert wide.lower < narrow.lower and wide.upper > narrow.upper
    few, many = mtbf(exposure, r), mtbf(exposure * 4, 4 * r)  # same MTBF, four times the evidence
    assert (
        few.upper is not None and few.lower is not None and many.upper is not None and many.lower is not None
    )
    assert many.upper / many.lower < few.upper / few.lower


@settings(deadline=None, max_examples=1)
@given(st.just(0))
def test_the_interval_covers_the_true_mtbf_at_least_as_often_as_promised(_: int) -> None:
    """Synthetic histories: a fleet whose failures are Poisson with a known MTBF; the 90% interval must
    cover it in at least ~90% of the histories (the exact interval is conservative)."""
    rng = random.Random(17)
    true_mtbf, exposure, trials, covered = 500.0, 3000.0, 400, 0
    for _ in range(trials):
        t, failures = rng.expovariate(1 / true_mtbf), 0
        while t < exposure:
            failures += 1
            t += rng.expovariate(1 / true_mtbf)
        est = mtbf(exposure, failures, 0.9)
        upper = est.upper if est.upper is not None else math.inf
        assert est.lower is not None
        covered += est.lower <= true_mtbf <= upper
    assert covered / trials >= 0.86  # 0.9 less three standard errors of 400 trials


def test_bad_input_is_refused() -> None:
    for args in ((-1.0, 1), (1.0, -1), (math.inf, 1), (math.nan, 1)):
        with pytest.raises(ValueError):
            mtbf(*args)
    with pytest.raises(ValueError):
        mtbf(1.0, 1, confidence=1.0)
