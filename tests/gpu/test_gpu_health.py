"""gpu_health events derived from GPU samples: transitions, re-reports, clears, noise, and the rule pack."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from watchd.gpu.health import CONDITIONS, HealthDeriver, HealthThresholds
from watchd.gpu.model import (
    CLOCK_GPU_IDLE,
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_SW_THERMAL,
    GpuIdentity,
    GpuSample,
)
from watchd.model.events import Event, stable_id
from watchd.rules import RuleSet, load_rules

RULES = Path(__file__).parent.parent.parent / "rules"
NODE = "gpu-1"
GPU0 = GpuIdentity(index=0, uuid="GPU-aaaa", pci_bus_id="0000:3b:00.0", model="NVIDIA H100")
GPU1 = GpuIdentity(index=1, uuid="GPU-bbbb", pci_bus_id="0000:5e:00.0", model="NVIDIA H100")

#: A healthy, busy GPU with every field supported.
HEALTHY: dict[str, Any] = {
    "util_gpu": 90.0,
    "temp_c": 60.0,
    "power_w": 500.0,
    "sm_clock_mhz": 1980.0,
    "sm_clock_max_mhz": 1980.0,
    "clock_event_reasons": 0,
    "ecc_volatile_uncorrected": 0,
    "remap_pending": False,
    "remap_failure": False,
    "retired_pages_pending": False,
    "pcie_replay_count": 0,
    "pcie_link_gen": 5,
    "pcie_link_gen_max": 5,
    "pcie_link_width": 16,
    "pcie_link_width_max": 16,
    "nvlink_up": (True,) * 18,
    "nvlink_errors": 0,
    "recovery_action": 0,
}


def sample(t: float, gpu: GpuIdentity = GPU0, **fields: Any) -> GpuSample:
    return GpuSample(time=t, gpu=gpu, **{**HEALTHY, **fields})


def run(deriver: HealthDeriver, samples: list[GpuSample]) -> list[Event]:
    return [e for s in samples for e in deriver.observe(s, NODE)]


def timeline(events: list[Event], condition: str) -> list[tuple[float, Any]]:
    return [(e.time, e.attrs["value"]) for e in events if e.attrs["condition"] == condition]


def every(start: float, stop: float, step: float = 1.0) -> list[float]:
    n = round((stop - start) / step)
    return [start + i * step for i in range(n + 1)]


def test_healthy_gpu_produces_nothing() -> None:
    d = HealthDeriver()
    assert run(d, [sample(t) for t in every(0, 300)]) == []
    assert d.active(GPU0.uuid) == {}


def test_event_shape_id_and_contract_attrs() -> None:
    d = HealthDeriver(source="dcgm")
    d.observe(sample(100.0), NODE)
    [event] = d.observe(sample(101.0, ecc_volatile_uncorrected=2), NODE)
    assert event.kind == "gpu_health"
    assert event.source == "dcgm"
    assert event.node == NODE
    assert event.time == 101.0
    assert event.id == stable_id(NODE, "gpu_health", GPU0.uuid, "ecc_dbe", 101.0)
    assert event.attrs == {
        "condition": "ecc_dbe",
        "gpu": 0,
        "uuid": GPU0.uuid,
        "pci_bus_id": "0000:3b:00.0",
        "value": 2,
        "threshold": 0,
        "evidence": "volatile uncorrectable ECC count 2, 2 new",
    }


def test_ecc_dbe_fires_repeats_on_interval_and_on_new_errors_clears_on_reset() -> None:
    d = HealthDeriver(report_interval_s=30)
    counts = {t: 0 for t in every(0, 9)} | {t: 1 for t in every(10, 44)} | {t: 3 for t in every(45, 80)}
    counts |= {t: 0 for t in every(81, 120)}  # GPU reset: the volatile counter restarts
    events = run(d, [sample(t, ecc_volatile_uncorrected=c) for t, c in sorted(counts.items())])
    assert timeline(events, "ecc_dbe") == [(10, 1), (40, 1), (45, 3), (75, 3), (81, 0)]
    assert all(e.attrs["condition"] == "ecc_dbe" for e in events)


def test_ecc_count_at_first_sample_is_the_baseline_and_reset_rebaselines_at_zero() -> None:
    d = HealthDeriver()
    events = run(d, [sample(t, ecc_volatile_uncorrected=5) for t in every(0, 10)])
    assert events == []  # counted before watchd started
    events = run(d, [sample(11, ecc_volatile_uncorrected=1)])  # reset, then one new error
    assert timeline(events, "ecc_dbe") == [(11, 1)]


@pytest.mark.parametrize(
    ("condition", "field"),
    [
        ("row_remap_failure", "remap_failure"),
        ("row_remap_pending", "remap_pending"),
        ("retired_pages_pending", "retired_pages_pending"),
    ],
)
def test_flags_fire_once_repeat_and_clear(condition: str, field: str) -> None:
    d = HealthDeriver(report_interval_s=30)
    flags = [False] * 5 + [True] * 70 + [False] * 20
    flag_fields: list[dict[str, Any]] = [{field: f} for f in flags]
    events = run(d, [sample(t, **f) for t, f in enumerate(flag_fields)])
    assert timeline(events, condition) == [(5, 1), (35, 1), (65, 1), (75, 0)]
    assert "pending" in str(events[0].attrs["evidence"]) or "failure" in str(events[0].attrs["evidence"])
    assert "threshold" not in events[0].attrs


def test_gpu_lost_fires_and_clears_and_freezes_other_conditions() -> None:
    d = HealthDeriver(report_interval_s=30)
    samples = [sample(t, remap_pending=True) for t in every(0, 9)]
    samples += [GpuSample(time=t, gpu=GPU0, lost=True) for t in every(10, 50)]
    samples += [sample(t) for t in every(51, 60)]
    events = run(d, samples)
    assert timeline(events, "gpu_lost") == [(10, 1), (40, 1), (51, 0)]
    # remap_pending was set before the loss; while lost it is unknown: no repeat, no clear, until t=51
    assert timeline(events, "row_remap_pending") == [(0, 1), (51, 0)]
    lost = next(e for e in events if e.attrs["condition"] == "gpu_lost")
    assert lost.attrs["evidence"] == "NVML: GPU is lost"
    assert lost.attrs["gpu"] == 0 and lost.attrs["pci_bus_id"] == "0000:3b:00.0"


def test_recovery_action_names_the_action_and_reports_changes_at_once() -> None:
    d = HealthDeriver(report_interval_s=30)
    codes = [0] * 3 + [1] * 40 + [5] * 2 + [0] * 3 + [9]
    events = run(d, [sample(t, recovery_action=c) for t, c in enumerate(codes)])
    got = [(e.time, e.attrs["value"], e.attrs["evidence"]) for e in events]
    assert got == [
        (3, 1, "GPU_RESET"),
        (33, 1, "GPU_RESET"),
        (43, 5, "RECOVER_IMEX_DOMAIN"),
        (45, 0, "NONE"),
        (48, 9, "UNKNOWN_9"),
    ]


def test_pcie_replay_burst_over_the_interval_with_hysteresis() -> None:
    th = HealthThresholds(pcie_replay_burst=100, pcie_replay_clear=10)
    d = HealthDeriver(report_interval_s=30, thresholds=th)
    count, samples = 0, []
    for t in every(0, 200):
        if 10 <= t < 100:
            count += 5  # 150 per 30 s: a burst
        elif 100 <= t < 160:
            count += 1 if t % 10 == 0 else 0  # 3 per 30 s: still above 0, below the clear threshold
        samples.append(sample(t, pcie_replay_count=count))
    events = timeline(run(d, samples), "pcie_replay_burst")
    assert events[0] == (30, 105)  # 21 increases of 5 within (0, 30]
    # at 128 the last 30 s hold 8 replays (one burst straggler at 99, 100, 110, 120): at or below 10, cleared;
    # the trickle of 3 per 30 s afterwards is above 0 yet starts nothing
    assert events[1:] == [(60, 150), (90, 150), (120, 48), (128, 0)]


def test_pcie_replay_burst_near_threshold_does_not_flap() -> None:
    th = HealthThresholds(pcie_replay_burst=100, pcie_replay_clear=10)
    d = HealthDeriver(report_interval_s=30, thresholds=th)
    count, samples = 0, []
    for t in every(0, 600):
        count += 4 if t % 2 else 3  # ~105 per 30 s: hovering around the threshold
        samples.append(sample(t, pcie_replay_count=count))
    events = timeline(run(d, samples), "pcie_replay_burst")
    assert all(v > 0 for _, v in events)  # fired once, then only re-reports: no clear, no re-fire
    assert [t for t, _ in events] == every(events[0][0], events[0][0] + 30 * (len(events) - 1), 30)


def test_counter_resets_give_no_negative_delta_and_no_burst() -> None:
    d = HealthDeriver(report_interval_s=30)
    samples = [sample(t, pcie_replay_count=50_000, nvlink_errors=9_000) for t in every(0, 10)]
    samples += [sample(t, pcie_replay_count=0, nvlink_errors=0) for t in every(11, 20)]  # driver reload
    samples += [sample(t, pcie_replay_count=60_000, nvlink_errors=1) for t in every(21, 21)]  # a jump back up
    events = run(d, samples)
    assert timeline(events, "nvlink_errors") == []
    # 0 -> 60000 after a reset is a real increase of the counter and does show as a burst
    assert timeline(events, "pcie_replay_burst") == [(21, 60_000)]
    d = HealthDeriver(report_interval_s=30)
    events = run(d, [sample(0, pcie_replay_count=500), sample(1, pcie_replay_count=3)])
    assert events == []


def test_nvlink_errors_burst_and_clear_after_a_quiet_interval() -> None:
    d = HealthDeriver(report_interval_s=30, thresholds=HealthThresholds(nvlink_error_burst=10))
    errors = [0] * 5 + [20] + [20] * 60
    events = timeline(run(d, [sample(t, nvlink_errors=e) for t, e in enumerate(errors)]), "nvlink_errors")
    assert events == [(5, 20), (35, 0)]


def test_nvlink_down_link_that_was_up_and_recovery() -> None:
    d = HealthDeriver(report_interval_s=30)
    up = (True,) * 18
    down = tuple(i not in (4, 7) for i in range(18))
    samples = [sample(t, nvlink_up=up) for t in every(0, 4)]
    samples += [sample(t, nvlink_up=down) for t in every(5, 40)]
    samples += [sample(41, nvlink_up=up[:17] + (False,) * 1)]  # 4 and 7 back, 17 down
    samples += [sample(t, nvlink_up=up) for t in every(42, 45)]
    events = [e for e in run(d, samples) if e.attrs["condition"] == "nvlink_down"]
    assert [(e.time, e.attrs["value"]) for e in events] == [(5, 2), (35, 2), (41, 1), (42, 0)]
    assert events[0].attrs["evidence"] == "NVLink 4, 7 down (16 of 18 up)"
    assert events[2].attrs["evidence"] == "NVLink 17 down (17 of 18 up)"


def test_nvlink_links_never_up_and_fewer_links_reported() -> None:
    d = HealthDeriver()
    partial = tuple(i < 12 for i in range(18))  # 6 links never trained: not "down" (no baseline)
    assert run(d, [sample(t, nvlink_up=partial) for t in every(0, 5)]) == []
    events = run(d, [sample(6, nvlink_up=(True,) * 10)])  # fewer links than at the first sample
    assert timeline(events, "nvlink_down") == [(6, 2)]


def test_pcie_width_downtrain_needs_a_streak_and_clears_with_one() -> None:
    d = HealthDeriver(report_interval_s=30)
    widths = [16] * 5 + [8] + [16] * 5 + [8] * 40 + [16, 8] + [16] * 5
    events = [e for e in run(d, [sample(t, pcie_link_width=w) for t, w in enumerate(widths)])]
    got = timeline(events, "pcie_downtrain")
    assert got == [(13, 8), (43, 8), (55, 0)]  # the single x8 at t=5 is noise; the x16 at 51 is too
    first = events[0]
    assert first.attrs["threshold"] == 16
    assert first.attrs["evidence"] == "PCIe Gen5 x8, expected x16"


def test_pcie_gen_below_max_counts_only_when_busy() -> None:
    d = HealthDeriver(report_interval_s=30)
    idle = [sample(t, util_gpu=0.0, pcie_link_gen=1) for t in every(0, 100)]
    assert run(d, idle) == []  # idle GPUs drop the link generation to save power
    busy = [sample(t, util_gpu=95.0, pcie_link_gen=3) for t in every(101, 110)]
    events = [e for e in run(d, busy) if e.attrs["condition"] == "pcie_downtrain"]
    assert [(e.time, e.attrs["value"], e.attrs["threshold"]) for e in events] == [(103, 3, 5)]
    assert events[0].attrs["evidence"] == "PCIe Gen3 x16 at 95% utilization, expected Gen5"
    # going idle says nothing about the generation: no clear, no repeat
    assert run(d, [sample(t, util_gpu=0.0, pcie_link_gen=1) for t in every(111, 200)]) == []
    back = run(d, [sample(t, util_gpu=95.0, pcie_link_gen=5) for t in every(201, 210)])
    # busy again at max: still held (due for a repeat) until a streak of three good samples clears it
    assert timeline(back, "pcie_downtrain") == [(201, 3), (203, 0)]


@pytest.mark.parametrize(
    ("condition", "bit"),
    [
        ("hw_slowdown", CLOCK_HW_SLOWDOWN),
        ("thermal_slowdown", CLOCK_HW_THERMAL),
        ("thermal_slowdown", CLOCK_SW_THERMAL),
        ("power_brake", CLOCK_HW_POWER_BRAKE),
    ],
)
def test_clock_reason_fraction_fires_repeats_and_clears(condition: str, bit: int) -> None:
    d = HealthDeriver(report_interval_s=30)
    reasons = [CLOCK_GPU_IDLE] * 40 + [bit] * 100 + [0] * 60
    events = [e for e in run(d, [sample(t, clock_event_reasons=r) for t, r in enumerate(reasons)])]
    got = timeline(events, condition)
    # window 30 s of 1 s samples: more than 50% set after 16 samples; below 20% after 25 clear ones
    assert got[0] == (55, 0.533)
    assert [t for t, _ in got] == [55, 85, 115, 145, 164]
    assert got[-1][1] == 0
    assert events[0].attrs["threshold"] == 0.5
    assert str(events[0].attrs["evidence"]).startswith(
        {CLOCK_HW_SLOWDOWN: "HwSlowdown", CLOCK_HW_THERMAL: "HwThermal", CLOCK_SW_THERMAL: "SwThermal"}.get(
            bit, "HwPowerBrake"
        )
    )


def test_clock_reason_noise_near_threshold_does_not_flap() -> None:
    d = HealthDeriver(report_interval_s=30)
    # thermal set in 3 of every 5 samples (60%) until t=200, then in 2 of 5 (40%): between the thresholds
    reasons = [CLOCK_HW_THERMAL if t % 5 < (3 if t < 200 else 2) else 0 for t in range(600)]
    got = timeline(
        run(d, [sample(t, clock_event_reasons=r) for t, r in enumerate(reasons)]), "thermal_slowdown"
    )
    assert got[0][1] > 0.5
    assert all(v > 0 for _, v in got)  # never cleared
    assert [t for t, _ in got] == every(got[0][0], got[0][0] + 30 * (len(got) - 1), 30)


def test_single_slowdown_blip_and_thin_window_do_nothing() -> None:
    d = HealthDeriver()
    # a PState change flags HwSlowdown for one sample
    reasons = [0] * 10 + [CLOCK_HW_SLOWDOWN] + [0] * 10
    assert run(d, [sample(t, clock_event_reasons=r) for t, r in enumerate(reasons)]) == []
    d = HealthDeriver()
    # one sample a minute: the 30 s window never holds 3 samples, so nothing is judged
    assert run(d, [sample(t, clock_event_reasons=CLOCK_HW_THERMAL) for t in every(0, 600, 60)]) == []


def test_none_fields_never_produce_events() -> None:
    d = HealthDeriver()
    fields: dict[str, Any] = dict.fromkeys(HEALTHY)
    samples = [GpuSample(time=t, gpu=GPU0, **fields) for t in every(0, 100)]
    assert run(d, samples) == []
    d = HealthDeriver()
    # a condition that holds, then its field becomes unsupported: frozen, neither repeated nor cleared
    samples = [sample(t, remap_failure=True) for t in every(0, 5)]
    samples += [sample(t, remap_failure=None) for t in every(6, 100)]
    assert timeline(run(d, samples), "row_remap_failure") == [(0, 1)]
    assert d.active(GPU0.uuid) == {"row_remap_failure": 1}


def test_interleaved_gpus_keep_separate_state() -> None:
    d = HealthDeriver(report_interval_s=30)
    samples: list[GpuSample] = []
    for t in every(0, 60):
        samples.append(sample(t, GPU0, ecc_volatile_uncorrected=0 if t < 10 else 1))
        samples.append(sample(t + 0.5, GPU1, ecc_volatile_uncorrected=0, remap_pending=20 <= t < 30))
    events = run(d, samples)
    got = [(e.attrs["gpu"], e.attrs["condition"], e.time, e.attrs["value"]) for e in events]
    assert got == [
        (0, "ecc_dbe", 10, 1),
        (1, "row_remap_pending", 20.5, 1),
        (1, "row_remap_pending", 30.5, 0),
        (0, "ecc_dbe", 40, 1),
    ]
    assert len({e.id for e in events}) == len(events)


def test_several_conditions_in_one_sample_come_in_contract_order_with_unique_ids() -> None:
    d = HealthDeriver()
    d.observe(sample(0), NODE)
    bad = sample(
        1, ecc_volatile_uncorrected=1, remap_failure=True, remap_pending=True, retired_pages_pending=True
    )
    events = d.observe(replace(bad, recovery_action=4), NODE)
    assert [e.attrs["condition"] for e in events] == [
        "ecc_dbe",
        "row_remap_failure",
        "row_remap_pending",
        "retired_pages_pending",
        "recovery_action",
    ]
    assert len({e.id for e in events}) == 5
    assert [c for c in CONDITIONS if c in d.active(GPU0.uuid)] == [e.attrs["condition"] for e in events]


def test_duplicate_and_backwards_sample_times() -> None:
    d = HealthDeriver(report_interval_s=30)
    assert run(d, [sample(100, remap_pending=True)]) != []
    assert d.observe(sample(100, remap_pending=False), NODE) == []  # the same reading time again: ignored
    # the clock stepped back an hour: the report schedule restarts from the new time
    assert run(d, [sample(t, remap_pending=True) for t in every(-3500, -3471)]) == []
    assert timeline(run(d, [sample(-3470, remap_pending=True)]), "row_remap_pending") == [(-3470, 1)]


def test_thresholds_are_validated() -> None:
    with pytest.raises(ValueError):
        HealthThresholds(slowdown_clear=0.0)
    with pytest.raises(ValueError):
        HealthThresholds(pcie_replay_burst=5, pcie_replay_clear=10)
    with pytest.raises(ValueError):
        HealthDeriver(report_interval_s=0)


# --- the contract matches the shipped rules ---------------------------------------------------------------


@functools.cache
def rule_pack() -> RuleSet:
    return load_rules([RULES])


def decide(events: list[Event]) -> list[tuple[float, str, str]]:
    engine = rule_pack().engine()
    return [(d.event.time, d.rule, a.kind) for e in events for d in engine.evaluate(e) for a in d.actions]


def test_rule_pack_drains_on_a_derived_ecc_dbe() -> None:
    d = HealthDeriver(report_interval_s=30)
    samples = [sample(t, ecc_volatile_uncorrected=0 if t < 5 else 2) for t in every(0, 10)]
    decisions = decide(run(d, samples))
    assert decisions == [
        (5, "gpu-ecc-dbe", "drain"),
        (5, "gpu-ecc-dbe", "requeue"),
        (5, "gpu-ecc-dbe", "alert"),
    ]
    engine = rule_pack().engine()
    [decision] = engine.evaluate(run(HealthDeriver(), samples)[0])
    assert decision.actions[0].params["reason"] == (
        "GPU0 ECC DBE: volatile uncorrectable ECC count 2, 2 new (GPU 0000:3b:00.0)"
    )


def test_rule_pack_alerts_on_thermal_slowdown_held_ten_minutes() -> None:
    d = HealthDeriver(report_interval_s=30)
    samples = [sample(t, clock_event_reasons=CLOCK_HW_THERMAL) for t in every(0, 15 * 60)]
    events = run(d, samples)
    assert timeline(events, "thermal_slowdown")[0] == (2, 1.0)  # three samples, all throttled
    decisions = decide(events)
    assert decisions == [(602, "gpu-throttled-sustained", "alert")]


def test_rule_pack_thermal_slowdown_that_clears_before_ten_minutes_does_not_alert() -> None:
    d = HealthDeriver(report_interval_s=30)
    reasons = [CLOCK_HW_THERMAL] * 300 + [0] * 60 + [CLOCK_HW_THERMAL] * 500
    events = run(d, [sample(t, clock_event_reasons=r) for t, r in enumerate(reasons)])
    assert 0 in [v for _, v in timeline(events, "thermal_slowdown")]
    assert decide(events) == []


@pytest.mark.parametrize(
    "condition",
    [
        "ecc_dbe",
        "row_remap_failure",
        "row_remap_pending",
        "retired_pages_pending",
        "recovery_action",
        "pcie_replay_burst",
        "nvlink_down",
        "nvlink_errors",
        "hw_slowdown",
        "thermal_slowdown",
        "power_brake",
        "gpu_lost",
        "pcie_downtrain",
    ],
)
def test_rule_pack_decides_nothing_on_a_clear(condition: str) -> None:
    clear = Event(
        id="c",
        node=NODE,
        source="nvml",
        kind="gpu_health",
        time=0.0,
        attrs={
            "condition": condition,
            "gpu": 0,
            "uuid": GPU0.uuid,
            "pci_bus_id": GPU0.pci_bus_id,
            "value": 0,
        },
    )
    assert rule_pack().engine().evaluate(clear) == []
