"""Energy and idle attribution with the fake GPU backend driven through scenarios of known power: samples ->
the agent's window summaries (job labels per GPU) -> the engine's usage ledger -> the state database -> the
report, per account. The backend's own energy counter (the integral of its mean power) is the reference."""

from __future__ import annotations

import pytest

from watchd.gpu.summary import WindowSummarizer
from watchd.model.events import Event
from watchd.reports.core import build_report
from watchd.reports.ledger import UsageLedger
from watchd.reports.model import JobRecord
from watchd.reports.observed import load_observed
from watchd.reports.source import FakeAccounting
from watchd.sim.gpu import FakeGpuBackend
from watchd.sim.scenario import PowerBrake, Scenario
from watchd.store.database import Store

T0 = 1_800_000_000.0
SECONDS = 600
BRAKE_AT = 300.0


def _drive(backend: FakeGpuBackend, node: str, jobs: dict[int, str]) -> tuple[list[Event], dict[int, float]]:
    """Sample every GPU once a second for SECONDS; the windows' events and each GPU's counter delta."""
    summarizer = WindowSummarizer(window_s=5.0)
    events: list[Event] = []
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for k in range(SECONDS + 1):
        now = T0 + k
        for gpu in backend.gpus:
            s = backend.sample(gpu, now)
            assert s.energy_j is not None
            first.setdefault(gpu.index, s.energy_j)
            last[gpu.index] = s.energy_j
            events += summarizer.observe(s, node, jobs[gpu.index])
    events += summarizer.flush(node)
    return events, {i: last[i] - first[i] for i in first}


@pytest.fixture
def observed_report() -> tuple[object, dict[int, float], dict[int, float]]:
    # gpu-1: a training job per half of the board (560 W each); teamb's half power-braked (x0.5) after 300 s
    brake = PowerBrake(at=BRAKE_AT, gpu=[4, 5, 6, 7])
    busy = FakeGpuBackend(Scenario.training(gpus=8, faults=[brake]), start_time=T0)
    labels = {i: "slurm:101" if i < 4 else "slurm:102" for i in range(8)}
    ev1, delta1 = _drive(busy, "gpu-1", labels)
    # gpu-2: a job that holds 8 GPUs and does nothing (idle load: util 0, 10 % of TDP)
    idle = FakeGpuBackend(Scenario.idle(gpus=8), start_time=T0)
    ev2, delta2 = _drive(idle, "gpu-2", dict.fromkeys(range(8), "slurm:103"))

    ledger = UsageLedger(idle_util_pct=5.0)
    for e in ev1 + ev2:
        ledger.observe(e)
    store = Store.open(":memory:")
    gpus, cps = ledger.take()
    store.usage.add(
        [(d.job, d.node, d.gpu, d.day, d.energy_j, d.gpu_s, d.idle_s, d.first, d.last) for d in gpus], cps
    )
    observed = load_observed(store, T0 - 3600, T0 + 3600)
    jobs = [
        JobRecord("101", "teama", "alice", "gpu", 4, T0 - 10, T0, T0 + SECONDS, "COMPLETED", ("gpu-1",)),
        JobRecord("102", "teamb", "bob", "gpu", 4, T0 - 10, T0, T0 + SECONDS, "COMPLETED", ("gpu-1",)),
        JobRecord("103", "teamc", "carol", "gpu", 8, T0 - 10, T0, T0 + SECONDS, "COMPLETED", ("gpu-2",)),
    ]
    acct = FakeAccounting(jobs).fetch(T0 - 3600, T0 + 3600)
    report = build_report(acct, observed, start=T0 - 3600, end=T0 + 3600, now=T0 + 3600)
    return report, delta1, delta2


def test_energy_per_account_is_the_counters_integral(
    observed_report: tuple[object, dict[int, float], dict[int, float]],
) -> None:
    report, delta1, delta2 = observed_report
    rows = {r.key["account"]: r for r in report.rows}  # type: ignore[attr-defined]
    expected = {
        "teama": sum(delta1[i] for i in range(4)) / 3.6e6,
        "teamb": sum(delta1[i] for i in range(4, 8)) / 3.6e6,
        "teamc": sum(delta2.values()) / 3.6e6,
    }
    for account, kwh in expected.items():
        # window means of +-5 % noise against the noiseless integral; the last window ends a second later
        assert rows[account].energy_kwh == pytest.approx(kwh, rel=0.03), account
    # the known power: 4 x 560 W x 600 s; teamb half of that for its braked second half
    assert rows["teama"].energy_kwh == pytest.approx(4 * 560 * SECONDS / 3.6e6, rel=0.03)
    assert rows["teamb"].energy_kwh == pytest.approx(
        4 * 560 * (BRAKE_AT + 0.5 * (SECONDS - BRAKE_AT)) / 3.6e6, rel=0.03
    )
    assert rows["teamc"].energy_kwh == pytest.approx(8 * 70 * SECONDS / 3.6e6, rel=0.03)


def test_idle_gpu_hours_are_the_idle_jobs(
    observed_report: tuple[object, dict[int, float], dict[int, float]],
) -> None:
    report, _, _ = observed_report
    rows = {r.key["account"]: r for r in report.rows}  # type: ignore[attr-defined]
    # 8 GPUs x 600 s observed, all of it idle; the training jobs never idle
    assert rows["teamc"].observed_gpu_hours == pytest.approx(8 * SECONDS / 3600, rel=0.02)
    assert rows["teamc"].idle_gpu_hours == pytest.approx(rows["teamc"].observed_gpu_hours)
    assert rows["teama"].idle_gpu_hours == 0.0
    assert rows["teamb"].idle_gpu_hours == 0.0
    # accounting's GPU-hours and watchd's observed ones agree
    for r in rows.values():
        assert r.observed_gpu_hours == pytest.approx(r.gpu_hours, rel=0.02)
