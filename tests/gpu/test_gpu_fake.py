"""The scenario-driven fake GPU backend: determinism, every fault's effect, kernel lines, validation."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from watchd.errors import ConfigError
from watchd.gpu.backend import GpuBackend, XidNotice
from watchd.gpu.model import (
    CLOCK_GPU_IDLE,
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_SW_THERMAL,
    GpuLostError,
    GpuSample,
)
from watchd.sim.gpu import FakeGpuBackend
from watchd.sim.scenario import (
    EccDbe,
    FallOffBus,
    HwSlowdown,
    NcclHang,
    NvlinkDown,
    PcieDowntrain,
    PowerBrake,
    RowRemapFailure,
    Scenario,
    StalledRank,
    Straggler,
    Thermal,
    XidFault,
    load_scenario,
    parse_scenario,
)
from watchd.xid.parser import parse_text

T0 = 1_700_000_000.0
SCENARIOS = Path(__file__).parent.parent / "gpu_scenarios"


def _backend(*faults: object, **kw: object) -> tuple[FakeGpuBackend, list[str]]:
    lines: list[str] = []
    scenario = Scenario.training(gpus=8, seed=5, faults=faults, **kw)  # type: ignore[arg-type]
    backend = FakeGpuBackend(scenario, T0, lines.append)
    backend.open()
    return backend, lines


def _at(backend: FakeGpuBackend, index: int, t: float) -> GpuSample:
    return backend.sample(backend.gpus[index], T0 + t)


def test_is_a_gpu_backend() -> None:
    backend: GpuBackend = FakeGpuBackend(Scenario.training(gpus=2), T0)
    assert backend.name == "fake"


def test_deterministic_whatever_the_order() -> None:
    a, _ = _backend()
    b, _ = _backend()
    forward = [_at(a, i, t) for t in (0, 1.5, 10, 100) for i in range(8)]
    backward = [_at(b, i, t) for t in (100, 10, 1.5, 0) for i in reversed(range(8))]
    assert sorted(forward, key=lambda s: (s.time, s.gpu.index)) == sorted(
        backward, key=lambda s: (s.time, s.gpu.index)
    )
    assert _at(a, 0, 1) != _at(a, 0, 2)  # noise moves with time
    other = FakeGpuBackend(Scenario.training(gpus=8, seed=6), T0)
    assert other.gpus[0].uuid != a.gpus[0].uuid


def test_healthy_training_is_realistic() -> None:
    backend, lines = _backend()
    samples = [_at(backend, i, t) for i in range(8) for t in range(0, 60, 5)]
    for s in samples:
        assert s.util_gpu is not None and 95 <= s.util_gpu <= 100
        assert s.power_w is not None and 0.7 * 700 <= s.power_w <= 0.9 * 700
        assert s.sm_clock_mhz is not None and 1980 - 50 <= s.sm_clock_mhz <= 1980
        assert s.clock_event_reasons == 0
        assert s.nvlink_up == (True,) * 18
        assert s.nvlink_tx_bytes_per_s is not None and s.nvlink_tx_bytes_per_s > 1e10
        assert s.pcie_link_width == 16 and s.pcie_link_gen == 5
        assert s.ecc_aggregate_uncorrected == 0 and s.remap_pending is False
        assert s.pids
    energy = [_at(backend, 0, t).energy_j or 0.0 for t in range(0, 100, 10)]
    assert energy == sorted(energy)
    assert lines == []
    ids = backend.open()
    assert [g.pci_bus_id for g in ids][:2] == ["0000:18:00.0", "0000:2a:00.0"]
    assert ids[0].model == "NVIDIA H100 80GB HBM3" and ids[0].uuid.startswith("GPU-")


def test_idle_load() -> None:
    backend = FakeGpuBackend(Scenario.idle(gpus=2), T0)
    s = backend.sample(backend.gpus[0], T0 + 5)
    assert s.util_gpu == 0 and s.power_w is not None and s.power_w < 100
    assert s.clock_event_reasons == CLOCK_GPU_IDLE and s.pids == ()
    assert s.pcie_link_gen == 1 and s.pcie_link_gen_max == 5  # the link downshifts at idle


def test_xid_fault_writes_kernel_line_once_and_comes_out_of_wait_xids() -> None:
    backend, lines = _backend(XidFault(at=10, gpu=2, code=13))
    _at(backend, 0, 9)
    assert lines == [] and backend.wait_xids(0) == []
    _at(backend, 0, 10)
    _at(backend, 1, 11)
    _at(backend, 2, 50)
    gpu = backend.gpus[2]
    assert lines[0] == f"NVRM: GPU at PCI:0000:3a:00: {gpu.uuid}"
    assert lines[1].startswith("NVRM: Xid (PCI:0000:3a:00): 13, pid=")
    assert len(lines) == 2
    notices = backend.wait_xids(0)
    assert [(n.gpu.index, n.xid) for n in notices] == [(2, 13)]
    assert backend.wait_xids(0) == []
    records = list(parse_text(lines))
    assert [(r.xid, r.pci_bus_id, r.uuid) for r in records] == [(13, gpu.pci_bus_id, gpu.uuid)]
    assert records[0].process == "python3"


def test_fall_off_bus() -> None:
    backend, lines = _backend(FallOffBus(at=30, gpu=4))
    assert not _at(backend, 4, 29).lost
    with pytest.raises(GpuLostError):
        _at(backend, 4, 30)
    with pytest.raises(GpuLostError):
        _at(backend, 4, 300)
    _at(backend, 3, 300)  # the others are fine
    xid_lines = [line for line in lines if "Xid" in line]
    assert xid_lines == [
        "NVRM: Xid (PCI:0000:9a:00): 79, pid=<unknown>, name=<unknown>, GPU has fallen off the bus."
    ]
    assert [r.xid for r in parse_text(lines)] == [79]
    assert [(n.gpu.index, n.xid) for n in backend.wait_xids(0)] == [(4, 79)]


def test_fall_off_bus_with_duration_comes_back() -> None:
    backend, _ = _backend(FallOffBus(at=30, gpu=4, duration=60))
    with pytest.raises(GpuLostError):
        _at(backend, 4, 60)
    assert _at(backend, 4, 91).util_gpu is not None


def test_ecc_dbe() -> None:
    backend, lines = _backend(EccDbe(at=20, gpu=1, count=2, recovery_action=1, duration=100))
    before = _at(backend, 1, 10)
    during = _at(backend, 1, 30)
    after = _at(backend, 1, 200)
    assert before.ecc_volatile_uncorrected == 0 and before.remap_pending is False
    assert during.ecc_volatile_uncorrected == 2 and during.ecc_aggregate_uncorrected == 2
    assert during.remap_pending is True and during.remapped_rows_uncorrectable == 2
    assert during.recovery_action == 1
    assert (
        after.ecc_volatile_uncorrected == 0 and after.ecc_aggregate_uncorrected == 2
    )  # reset, aggregate stays
    assert after.remap_pending is False and after.recovery_action == 0
    assert [r.xid for r in parse_text(lines)] == [48, 63]
    failed, _ = _backend(EccDbe(at=0, gpu=1, remap="failure"))
    assert _at(failed, 1, 1).remap_failure is True


def test_row_remap_failure() -> None:
    backend, lines = _backend(RowRemapFailure(at=5, gpu=0))
    assert _at(backend, 0, 4).remap_failure is False
    assert _at(backend, 0, 6).remap_failure is True
    assert [r.xid for r in parse_text(lines)] == [64]


def test_throttling_faults() -> None:
    backend, _ = _backend(
        Thermal(at=0, gpu=0, temp_c=93),
        PowerBrake(at=0, gpu=1),
        HwSlowdown(at=0, gpu=2),
        Straggler(at=0, gpu=3),
    )
    healthy = _at(backend, 7, 5)
    thermal, brake, slow, straggler = (_at(backend, i, 5) for i in range(4))
    assert healthy.sm_clock_mhz is not None and healthy.power_w is not None
    assert thermal.clock_event_reasons == CLOCK_SW_THERMAL and thermal.temp_c is not None
    assert thermal.temp_c >= 92 and thermal.sm_clock_mhz is not None
    assert thermal.sm_clock_mhz < 0.75 * healthy.sm_clock_mhz
    assert brake.clock_event_reasons == CLOCK_HW_SLOWDOWN | CLOCK_HW_POWER_BRAKE
    assert brake.power_w is not None and brake.power_w < 0.5 * 700
    assert slow.clock_event_reasons == CLOCK_HW_SLOWDOWN
    assert straggler.clock_event_reasons == 0 and straggler.sm_clock_mhz is not None
    assert 0.8 * 1980 <= straggler.sm_clock_mhz <= 0.86 * 1980


def test_nvlink_down_and_pcie_downtrain() -> None:
    backend, lines = _backend(NvlinkDown(at=0, gpu=0, links=(2, 5)), PcieDowntrain(at=0, gpu=1))
    s = _at(backend, 0, 1)
    assert s.nvlink_up is not None and not s.nvlink_up[2] and not s.nvlink_up[5] and sum(s.nvlink_up) == 16
    assert s.nvlink_errors is not None and s.nvlink_errors > 0
    assert [r.xid for r in parse_text(lines)] == [74, 74]
    p = _at(backend, 1, 1)
    assert p.pcie_link_width == 8 and p.pcie_link_width_max == 16


def test_nccl_hang_and_stalled_rank() -> None:
    scenario = load_scenario(SCENARIOS / "nccl_hang.yaml")
    backend = FakeGpuBackend(scenario, T0)
    before = backend.sample(backend.gpus[0], T0 + 299)
    hung = backend.sample(backend.gpus[0], T0 + 310)
    stalled = backend.sample(backend.gpus[6], T0 + 310)
    assert before.power_w is not None and before.power_w > 0.7 * 700
    assert hung.util_gpu is not None and hung.util_gpu >= 99
    assert hung.power_w is not None and 0.3 * 700 <= hung.power_w <= 0.4 * 700
    assert hung.nvlink_tx_bytes_per_s is not None and hung.nvlink_tx_bytes_per_s < 1e6
    assert hung.pcie_tx_bytes_per_s is not None and hung.pcie_tx_bytes_per_s < 1e6
    assert stalled.util_gpu == 0 and stalled.power_w is not None and stalled.power_w < 0.2 * 700


def test_mig_flag() -> None:
    backend = FakeGpuBackend(Scenario.training(gpus=4, mig=(1,)), T0)
    assert [g.mig_mode for g in backend.open()] == [False, True, False, False]
    s = backend.sample(backend.gpus[1], T0 + 1)
    assert s.util_gpu is None and s.power_w is not None  # device-level fields still there


def test_inject_at_runtime() -> None:
    backend, lines = _backend()
    _at(backend, 0, 10)
    backend.inject(NcclHang(gpu="all"), now=T0 + 20)
    assert _at(backend, 3, 19).util_gpu is not None
    s = _at(backend, 3, 21)
    assert s.power_w is not None and s.power_w < 0.45 * 700
    backend.inject(XidFault(code=94, gpu=2), now=T0 + 30)
    _at(backend, 0, 31)
    assert [r.xid for r in parse_text(lines)] == [94]
    with pytest.raises(ValueError, match="GPU index 9"):
        backend.inject(StalledRank(gpu=9))


def test_wait_xids_wakes_on_sample_from_another_thread() -> None:
    backend, _ = _backend(XidFault(at=5, gpu=0, code=31))
    got: list[XidNotice] = []
    waiter = threading.Thread(target=lambda: got.extend(backend.wait_xids(2.0)))
    waiter.start()
    _at(backend, 0, 6)
    waiter.join(2.5)
    assert [notice.xid for notice in got] == [31]
    backend.close()
    assert backend.wait_xids(5.0) == []  # closed: returns at once


def test_wait_xids_uses_the_clock() -> None:
    from watchd.clock import FakeClock

    clock = FakeClock(T0)
    lines: list[str] = []
    backend = FakeGpuBackend(
        Scenario.training(gpus=2, faults=[FallOffBus(at=5, gpu=1)]), T0, lines.append, clock=clock
    )
    assert backend.wait_xids(0.01) == []
    clock.advance(6)
    assert [n.xid for n in backend.wait_xids(0.01)] == [79]
    assert len(lines) == 2


def test_example_scenarios_load() -> None:
    files = sorted(SCENARIOS.glob("*.yaml"))
    assert len(files) >= 4
    for path in files:
        scenario = load_scenario(path)
        backend = FakeGpuBackend(scenario, T0)
        for gpu in backend.open():
            backend.sample(gpu, T0 + 400)


def test_scenario_thermal_straggler_file() -> None:
    backend = FakeGpuBackend(load_scenario(SCENARIOS / "thermal_straggler.yaml"), T0)
    assert backend.sample(backend.gpus[5], T0 + 61).clock_event_reasons == CLOCK_SW_THERMAL
    assert backend.sample(backend.gpus[5], T0 + 700).clock_event_reasons == 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpus": {"count": 8, "colour": "red"}}, "s.yaml: gpus.colour: unknown key"),
        (
            {"faults": [{"kind": "thermal", "at": 1, "gpu": 0, "bogus": 1}]},
            "s.yaml: faults.0.bogus: unknown key",
        ),
        ({"faults": [{"kind": "meltdown", "gpu": 0}]}, "s.yaml: faults.0:"),
        ({"faults": [{"kind": "xid", "gpu": 0}]}, "s.yaml: faults.0.code: Field required"),
        (
            {"gpus": {"count": 2}, "faults": [{"kind": "straggler", "gpu": 5}]},
            "s.yaml: faults.0.gpu: GPU index 5",
        ),
        ({"faults": [{"kind": "nvlink_down", "gpu": 0, "links": [20]}]}, "s.yaml: faults.0.links: link 20"),
        ({"gpus": {"model": "X9000"}}, "s.yaml: gpus: model 'X9000' has no preset"),
        ({"load": "gaming"}, "s.yaml: load:"),
        ({"sead": 1}, "s.yaml: sead: unknown key"),
    ],
)
def test_scenario_validation_errors(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_scenario(data, "s.yaml")
    assert message in str(info.value)


def test_custom_model_with_all_overrides() -> None:
    scenario = parse_scenario(
        {
            "gpus": {
                "model": "X9000",
                "count": 2,
                "tdp_w": 500,
                "sm_clock_max_mhz": 1500,
                "memory_gb": 96,
                "nvlinks": 0,
                "pcie_gen_max": 5,
                "pcie_width_max": 16,
            }
        }
    )
    backend = FakeGpuBackend(scenario, T0)
    s = backend.sample(backend.gpus[0], T0)
    assert s.nvlink_up is None and s.power_limit_w == 500 and backend.gpus[0].model == "NVIDIA X9000"
