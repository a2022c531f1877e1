"""gpu_summary window events: alignment, aggregates, clock reasons, job attribution, flush, lost samples."""

from __future__ import annotations

from typing import Any

import pytest

from watchd.gpu.model import (
    CLOCK_GPU_IDLE,
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_SW_POWER_CAP,
    CLOCK_SW_THERMAL,
    GpuIdentity,
    GpuSample,
)
from watchd.gpu.summary import WindowSummarizer
from watchd.model.events import Event, stable_id

NODE = "gpu-1"
GPU0 = GpuIdentity(index=0, uuid="GPU-aaaa", pci_bus_id="0000:3b:00.0", model="NVIDIA H100 80GB HBM3")
GPU1 = GpuIdentity(index=1, uuid="GPU-bbbb", pci_bus_id="0000:5e:00.0", model="NVIDIA H100 80GB HBM3")


def sample(t: float, gpu: GpuIdentity = GPU0, **fields: Any) -> GpuSample:
    return GpuSample(time=t, gpu=gpu, **fields)


def run(s: WindowSummarizer, samples: list[GpuSample], job: str | None = None) -> list[Event]:
    return [e for x in samples for e in s.observe(x, NODE, job)]


def test_window_closes_when_a_sample_falls_in_the_next_aligned_window() -> None:
    s = WindowSummarizer(window_s=5.0, source="dcgm")
    assert run(s, [sample(t, util_gpu=50.0) for t in (1002.0, 1003.0, 1004.9)]) == []
    [event] = s.observe(sample(1005.0, util_gpu=50.0), NODE, None)
    assert event.kind == "gpu_summary"
    assert event.source == "dcgm"
    assert event.node == NODE
    assert event.time == 1005.0  # the window's end: when its observation is complete
    assert event.attrs["window_start"] == 1000.0
    assert event.id == stable_id(NODE, "gpu_summary", GPU0.uuid, 1000.0)
    assert event.attrs["window_s"] == 5.0
    assert event.attrs["samples"] == 3
    # a gap of several windows closes the open one only: empty windows produce nothing
    [event] = s.observe(sample(1031.0, util_gpu=50.0), NODE, None)
    assert (event.time, event.attrs["samples"]) == (1010.0, 1)


def test_aggregates_mean_min_max_and_means() -> None:
    s = WindowSummarizer(window_s=10.0)
    samples = [
        sample(
            100.0 + i,
            util_gpu=u,
            power_w=p,
            sm_clock_mhz=c,
            sm_clock_max_mhz=1980.0,
            temp_c=tc,
            nvlink_tx_bytes_per_s=1e9 * (i + 1),
            nvlink_rx_bytes_per_s=2e9,
            pcie_tx_bytes_per_s=1e6,
            pcie_rx_bytes_per_s=3e6 * i,
            util_mem=40.0,
        )
        for i, (u, p, c, tc) in enumerate(
            [(10.0, 300.0, 1400.0, 50.0), (90.0, 700.0, 1980.0, 70.0), (50.0, 500.0, 1755.0, 66.0)]
        )
    ]
    [event] = run(s, samples) + s.flush(NODE)
    assert event.attrs == {
        "gpu": 0,
        "uuid": GPU0.uuid,
        "pci_bus_id": "0000:3b:00.0",
        "model": "NVIDIA H100 80GB HBM3",
        "window_s": 10.0,
        "window_start": 100.0,
        "samples": 3,
        "util_mean": 50.0,
        "util_min": 10.0,
        "util_max": 90.0,
        "power_mean": 500.0,
        "power_min": 300.0,
        "power_max": 700.0,
        "sm_clock_mean": 1711.667,
        "sm_clock_min": 1400.0,
        "sm_clock_max": 1980.0,
        "sm_clock_max_rated": 1980.0,
        "nvlink_tx_mean": 2e9,
        "nvlink_rx_mean": 2e9,
        "pcie_tx_mean": 1e6,
        "pcie_rx_mean": 3e6,
        "temp_mean": 62.0,
    }


def test_clock_reasons_are_ored_and_fractions_counted() -> None:
    s = WindowSummarizer(window_s=5.0)
    reasons = [CLOCK_GPU_IDLE, CLOCK_SW_POWER_CAP | CLOCK_HW_SLOWDOWN, CLOCK_HW_THERMAL, CLOCK_SW_THERMAL]
    samples = [sample(10.0 + i, clock_event_reasons=r) for i, r in enumerate(reasons)]
    samples.append(sample(14.5))  # reasons unsupported in this sample: not in the fractions' denominator
    [event] = run(s, samples) + s.flush(NODE)
    assert event.attrs["samples"] == 5
    expected = CLOCK_GPU_IDLE | CLOCK_SW_POWER_CAP | CLOCK_HW_SLOWDOWN | CLOCK_HW_THERMAL | CLOCK_SW_THERMAL
    assert event.attrs["clock_reasons"] == expected
    assert event.attrs["hw_slowdown_frac"] == 0.25
    assert event.attrs["thermal_frac"] == 0.5
    assert event.attrs["power_brake_frac"] == 0.0
    [brake] = run(
        s, [sample(20.0 + i, clock_event_reasons=CLOCK_HW_POWER_BRAKE) for i in range(3)]
    ) + s.flush(NODE)
    assert brake.attrs["power_brake_frac"] == 1.0


def test_keys_whose_inputs_were_all_none_are_left_out() -> None:
    s = WindowSummarizer()
    [event] = run(s, [sample(0.0), sample(1.0, temp_c=40.0)]) + s.flush(NODE)
    assert event.attrs == {
        "gpu": 0,
        "uuid": GPU0.uuid,
        "pci_bus_id": "0000:3b:00.0",
        "model": "NVIDIA H100 80GB HBM3",
        "window_s": 5.0,
        "window_start": 0.0,
        "samples": 2,
        "temp_mean": 40.0,
    }
    assert all(isinstance(v, str | int | float) for v in event.attrs.values())


def test_job_is_the_one_seen_in_most_samples_ties_to_the_latest() -> None:
    s = WindowSummarizer(window_s=5.0)
    for t, job in [(0.0, "101"), (1.0, "102"), (2.0, "102"), (3.0, None)]:
        s.observe(sample(t), NODE, job)
    for t, job in [(5.0, "101"), (6.0, "102"), (7.0, None)]:
        s.observe(sample(t), NODE, job)
    for t in (10.0, 11.0):
        s.observe(sample(t), NODE, None)
    events = s.flush(NODE) + s.observe(sample(20.0), NODE, None)
    assert len(events) == 1 and "job" not in events[0].attrs
    s = WindowSummarizer(window_s=5.0)
    out: list[Event] = []
    for t, job in [(0.0, "101"), (1.0, "102"), (2.0, "102"), (5.0, "101"), (6.0, "102"), (10.0, None)]:
        out += s.observe(sample(t), NODE, job)
    assert [e.attrs["job"] for e in out] == ["102", "102"]


def test_interleaved_gpus_each_get_their_window_and_flush_closes_all() -> None:
    s = WindowSummarizer(window_s=5.0)
    samples = []
    for t in range(12):
        samples.append(sample(float(t), GPU0, util_gpu=10.0))
        samples.append(sample(t + 0.5, GPU1, util_gpu=90.0))
    events = run(s, samples, job="7")
    assert [(e.attrs["gpu"], e.time, e.attrs["samples"], e.attrs["util_mean"]) for e in events] == [
        (0, 5.0, 5, 10.0),
        (1, 5.0, 5, 90.0),
        (0, 10.0, 5, 10.0),
        (1, 10.0, 5, 90.0),
    ]
    rest = s.flush(NODE)
    assert sorted((e.attrs["gpu"], e.time, e.attrs["samples"]) for e in rest) == [(0, 15.0, 2), (1, 15.0, 2)]
    assert s.flush(NODE) == []
    assert len({e.id for e in events + rest}) == 6


def test_lost_samples_are_not_summarized() -> None:
    s = WindowSummarizer(window_s=5.0)
    events = run(
        s, [sample(0.0, util_gpu=80.0), GpuSample(time=1.0, gpu=GPU0, lost=True), sample(2.0, util_gpu=60.0)]
    )
    # a lost sample in the next window closes the open one but opens none
    events += run(s, [GpuSample(time=t, gpu=GPU0, lost=True) for t in (5.0, 6.0, 11.0)])
    assert [(e.time, e.attrs["samples"], e.attrs["util_mean"]) for e in events] == [(5.0, 2, 70.0)]
    assert s.flush(NODE) == []


def test_one_event_per_window_whatever_the_sampling_rate() -> None:
    s = WindowSummarizer(window_s=5.0)
    events = run(s, [sample(i / 100, util_gpu=float(i % 100)) for i in range(3000)])  # 100 Hz for 30 s
    events += s.flush(NODE)
    assert [e.time for e in events] == [5.0, 10.0, 15.0, 20.0, 25.0, 30.0]
    assert all(e.attrs["samples"] == 500 for e in events)
    assert all(e.attrs["util_min"] == 0.0 and e.attrs["util_max"] == 99.0 for e in events)


def test_window_length_is_validated() -> None:
    with pytest.raises(ValueError):
        WindowSummarizer(window_s=0)
