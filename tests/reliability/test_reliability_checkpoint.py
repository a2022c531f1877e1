"""Young's and Daly's checkpoint intervals and the share of compute lost (watchd.reliability.checkpoint)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchd.reliability.checkpoint import daly, job_mtbf, waste, waste_first_order, young

MIN = 60.0
HOUR = 3600.0


# Daly, J. T. (2006). "A higher order estimate of the optimum checkpoint interval for restart dumps".
# Future Generation Computer Systems 22(3):303-312, doi:10.1016/j.future.2004.11.016. Figures 3-5 compare
# the model with simulation for a dump time delta = 5 min (R = 10 min, Ts = 500 h) and report the optimum
# interval the new model predicts: M = 24 h -> 117 min, M = 6 h -> 57 min, M = 15 min -> 9.1 min.
@pytest.mark.parametrize(
    ("mtbf_s", "expected_min", "tolerance_min"),
    [(24 * HOUR, 117.0, 0.5), (6 * HOUR, 57.0, 0.5), (15 * MIN, 9.1, 0.05)],
)
def test_daly_matches_the_worked_examples_of_daly_2006(
    mtbf_s: float, expected_min: float, tolerance_min: float
) -> None:
    assert daly(5 * MIN, mtbf_s) / MIN == pytest.approx(expected_min, abs=tolerance_min)


def test_young_is_the_square_root_of_twice_cost_times_mtbf() -> None:
    # Young (1974), CACM 17(9): T_opt = sqrt(2 * t_s * T_f); for the setting of Daly's Fig. 3,
    # sqrt(2 * 5 min * 1440 min) = 120 min, which Daly's correction lowers to the 117 min above
    assert young(5 * MIN, 24 * HOUR) / MIN == pytest.approx(120.0)


def test_beyond_twice_the_mtbf_daly_advises_the_mtbf() -> None:
    assert daly(2 * HOUR, 1 * HOUR) == 1 * HOUR
    assert daly(10 * HOUR, 1 * HOUR) == 1 * HOUR


costs = st.floats(1.0, 3600.0)
mtbfs = st.floats(3600.0, 1e8)


@given(costs, mtbfs, st.floats(0.05, 20.0))
def test_young_minimises_the_first_order_waste(c: float, m: float, k: float) -> None:
    assert waste_first_order(c, young(c, m), m) <= waste_first_order(c, k * young(c, m), m) + 1e-12


@given(costs, mtbfs)
def test_daly_is_close_to_the_optimum_of_the_complete_model(c: float, m: float) -> None:
    """Daly's estimate is a perturbation solution for the optimum of the exponential model: with C <= M/2 its
    share lost is within 0.1% (relative) of the best interval on a fine grid around it."""
    if c > m / 2:
        return
    best = min(waste(c, daly(c, m) * (0.5 + i / 200), m) for i in range(201))
    assert waste(c, daly(c, m), m) <= best * 1.001 + 1e-12


@given(costs, mtbfs)
def test_daly_is_young_less_the_cost_when_the_cost_is_small(c: float, m: float) -> None:
    x = c / (2 * m)
    assert daly(c, m) == pytest.approx(young(c, m) - c, abs=young(c, m) * (math.sqrt(x) / 3 + x / 9) + 1e-9)
    assert daly(c, m) < m or c >= 2 * m


@given(costs, st.floats(3600.0, 1e7), st.integers(1, 10_000))
def test_a_job_on_more_nodes_fails_sooner_and_checkpoints_more_often(
    c: float, node_mtbf: float, n: int
) -> None:
    m1, mn = job_mtbf(node_mtbf, 1), job_mtbf(node_mtbf, n)
    assert mn == pytest.approx(node_mtbf / n)
    assert daly(c, mn) <= daly(c, m1) + 1e-9
    assert young(c, mn) == pytest.approx(young(c, m1) / math.sqrt(n))


@given(costs, mtbfs, st.floats(1.0, 1e7), st.floats(0.0, 3600.0))
def test_the_share_lost_is_a_share(c: float, m: float, tau: float, r: float) -> None:
    w = waste(c, tau, m, r)
    assert 0.0 <= w <= 1.0
    assert 0.0 <= waste_first_order(c, tau, m) <= 1.0


@given(costs, st.floats(1e5, 1e8))
def test_the_complete_model_agrees_with_the_first_order_one_when_failures_are_rare(
    c: float, m: float
) -> None:
    tau = young(c, m)
    if (tau + c) / m > 0.01:
        return
    assert waste(c, tau, m) == pytest.approx(waste_first_order(c, tau, m), rel=0.05)


def test_a_worked_comparison() -> None:
    """A 512-node job, node MTBF 50,000 h, checkpoint 2 min: job MTBF 97.7 h, advised ~3.7 h; checkpointing
    every 12 h loses about twice as much compute."""
    m = job_mtbf(50_000 * HOUR, 512)
    assert m / HOUR == pytest.approx(97.66, abs=0.01)
    advised = daly(120.0, m)
    assert advised / HOUR == pytest.approx(math.sqrt(2 * 120 * m) / HOUR, rel=0.02)
    assert waste(120.0, 12 * HOUR, m) > 1.8 * waste(120.0, advised, m)


def test_bad_input_is_refused() -> None:
    for c, m in ((0.0, 1.0), (1.0, 0.0), (math.nan, 1.0), (1.0, math.inf)):
        with pytest.raises(ValueError):
            young(c, m)
        with pytest.raises(ValueError):
            daly(c, m)
    with pytest.raises(ValueError):
        waste(1.0, 0.0, 10.0)
    with pytest.raises(ValueError):
        job_mtbf(10.0, 0)
