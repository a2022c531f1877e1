"""The NVML backend against a faithful fake of ``pynvml``: the real module, its functions monkeypatched,
raising the real ``NVMLError_*`` classes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

from watchd.gpu.backend import GpuBackend
from watchd.gpu.model import BackendUnavailable, GpuLostError
from watchd.gpu.nvml import FIELDS, NvmlBackend

T0 = 1_700_000_000.0


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str
    name: str = "NVIDIA H100 80GB HBM3"
    mig: bool = False
    nvlinks: int = 18
    unsupported: set[str] = field(default_factory=set)  # pynvml function names raising NotSupported
    lost: bool = False
    failing: set[str] = field(default_factory=set)  # function names raising NVMLError_Unknown
    nvlink_tx_kib: int = 0
    pcie_counters: bool = False  # fields 197/198 (PCIe bytes) answered; off: the throughput call instead
    pcie_tx_bytes: int = 0
    pcie_rx_bytes: int = 0
    mig_children: list[list[int]] = field(default_factory=list)  # pids per MIG device


class FakeNvml:
    """Installs fake NVML functions on the real ``pynvml`` module; counts every call by function name."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.calls: Counter[str] = Counter()
        self.events: list[tuple[int, ...]] = []  # (gpu index, xid[, gpu instance, compute instance])
        self.init_error: type[Exception] | None = None
        self.events_supported = True
        self.mig_handles: dict[int, tuple[int, int]] = {}
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, self._wrap(name, getattr(self, name)))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls[name] += 1
            if args and isinstance(args[0], int) and args[0] < len(self.gpus):
                gpu = self.gpus[args[0]]
                if gpu.lost and name != "nvmlDeviceRegisterEvents":
                    raise pynvml.NVMLError_GpuIsLost()
                if name in gpu.unsupported:
                    raise pynvml.NVMLError_NotSupported()
                if name in gpu.failing:
                    raise pynvml.NVMLError_Unknown()
            return fn(*args)

        return call

    # handles are ints: the GPU index (MIG devices: 1000 + ...)
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h].bus_id)

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h].name

    def nvmlDeviceGetSerial(self, h: int) -> str:
        return f"16543210000{h}"

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        if not self.gpus[h].mig:
            raise pynvml.NVMLError_NotSupported()
        return [1, 1]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        if self.gpus[h].mig:
            raise pynvml.NVMLError_NotSupported()
        return SimpleNamespace(gpu=97, memory=41)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=80 * 2**30, used=70 * 2**30, free=10 * 2**30)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 67

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 612_345  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return 123_456_789  # mJ

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return 1965

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0x20

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return 0x40

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter_type: int) -> int:
        return {(0, 0): 1, (1, 0): 2, (0, 1): 10, (1, 1): 20}[(error_type, counter_type)]

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return (0, 1, 1, 0)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return 0

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return 3

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 8

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        return {pynvml.NVML_PCIE_UTIL_TX_BYTES: 1000, pynvml.NVML_PCIE_UTIL_RX_BYTES: 2000}[counter]  # KB/s

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= self.gpus[h].nvlinks:
            raise pynvml.NVMLError_InvalidArgument()
        return 0 if link == 3 else 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        if counter == pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA:
            raise pynvml.NVMLError_NotSupported()
        return 1 if link == 3 else 0

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[Any]) -> list[Any]:
        out = []
        for fid in ids:
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            if fid == 230:
                out.append(SimpleNamespace(nvmlReturn=0, valueType=1, value=SimpleNamespace(uiVal=0)))
            elif fid in (138, 139):
                assert scope == 0xFFFFFFFF
                value = SimpleNamespace(ullVal=self.gpus[h].nvlink_tx_kib)
                out.append(SimpleNamespace(nvmlReturn=0, valueType=3, value=value))
            elif fid in (197, 198) and self.gpus[h].pcie_counters:
                gpu = self.gpus[h]
                value = SimpleNamespace(ullVal=gpu.pcie_tx_bytes if fid == 197 else gpu.pcie_rx_bytes)
                out.append(SimpleNamespace(nvmlReturn=0, valueType=3, value=value))
            else:
                out.append(SimpleNamespace(nvmlReturn=pynvml.NVML_ERROR_NOT_SUPPORTED))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        if h >= 1000:
            parent, slot = self.mig_handles[h]
            return [SimpleNamespace(pid=p) for p in self.gpus[parent].mig_children[slot]]
        if self.gpus[h].mig:
            raise pynvml.NVMLError_NotSupported()
        return [SimpleNamespace(pid=4242 + h)]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, slot: int) -> int:
        if slot >= len(self.gpus[h].mig_children):
            raise pynvml.NVMLError_NotFound()
        handle = 1000 + 10 * h + slot
        self.mig_handles[handle] = (h, slot)
        return handle

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: int) -> int:
        if h < 1000:
            raise pynvml.NVMLError_InvalidArgument()
        return self.mig_handles[h][0]

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: int, types: int, event_set: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        if not self.events_supported or self.gpus[h].mig:
            raise pynvml.NVMLError_NotSupported()

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        if not self.events:
            raise pynvml.NVMLError_Timeout()
        index, xid, *instance = self.events.pop(0)
        gi, ci = instance or (0xFFFFFFFF, 0xFFFFFFFF)  # (index, xid[, gpu instance, compute instance])
        return SimpleNamespace(
            device=index, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid,
            gpuInstanceId=gi, computeInstanceId=ci,
        )  # fmt: skip

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass


def _gpus() -> list[FakeGpu]:
    return [
        FakeGpu("GPU-aaaa", "00000000:18:00.0"),
        FakeGpu("GPU-bbbb", "00000009:9B:00.0"),
    ]


def test_is_a_gpu_backend() -> None:
    backend: GpuBackend = NvmlBackend()
    assert backend.name == "nvml"


def test_open_normalizes_and_samples_with_unit_conversions(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(monkeypatch, _gpus())
    backend = NvmlBackend()
    gpus = backend.open()
    assert [(g.index, g.uuid, g.pci_bus_id) for g in gpus] == [
        (0, "GPU-aaaa", "0000:18:00.0"),
        (1, "GPU-bbbb", "0009:9b:00.0"),
    ]
    assert gpus[0].model == "NVIDIA H100 80GB HBM3" and gpus[0].mig_mode is False
    assert backend.supported_fields(gpus[0]) == frozenset(FIELDS)
    s = backend.sample(gpus[0], T0)
    assert s.time == T0 and s.gpu == gpus[0] and not s.lost
    assert (s.util_gpu, s.util_mem) == (97.0, 41.0)
    assert s.mem_used_bytes == 70 * 2**30 and s.mem_total_bytes == 80 * 2**30
    assert s.temp_c == 67.0
    assert s.power_w == pytest.approx(612.345) and s.power_limit_w == pytest.approx(700.0)
    assert s.energy_j == pytest.approx(123_456.789)
    assert (s.sm_clock_mhz, s.sm_clock_max_mhz) == (1965.0, 1980.0)
    assert s.clock_event_reasons == 0x20
    assert (s.ecc_volatile_corrected, s.ecc_volatile_uncorrected) == (1, 2)
    assert (s.ecc_aggregate_corrected, s.ecc_aggregate_uncorrected) == (10, 20)
    assert (s.remapped_rows_correctable, s.remapped_rows_uncorrectable) == (0, 1)
    assert (s.remap_pending, s.remap_failure, s.retired_pages_pending) == (True, False, False)
    assert s.pcie_replay_count == 3
    assert (s.pcie_link_gen, s.pcie_link_gen_max, s.pcie_link_width, s.pcie_link_width_max) == (5, 5, 8, 16)
    assert (s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s) == (1000 * 1024.0, 2000 * 1024.0)
    assert s.nvlink_up is not None and len(s.nvlink_up) == 18 and s.nvlink_up.count(False) == 1
    assert s.nvlink_errors == 3  # link 3: CRC FLIT + REPLAY + RECOVERY (CRC DATA unsupported)
    assert s.recovery_action == 0
    assert s.pids == (4242,)
    assert s.nvlink_tx_bytes_per_s is None  # a rate needs two samples
    nvml.gpus[0].nvlink_tx_kib = 10_000
    s2 = backend.sample(gpus[0], T0 + 2)
    assert s2.nvlink_tx_bytes_per_s == pytest.approx(10_000 * 1024 / 2)
    assert nvml.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0
    assert not backend.errors
    backend.close()


def test_not_supported_fields_are_probed_once_then_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = _gpus()
    gpus[1].unsupported = {"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPcieReplayCounter"}
    gpus[1].nvlinks = 0
    nvml = FakeNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    ids = backend.open()
    supported = backend.supported_fields(ids[1])
    assert {"energy", "pcie_replay", "nvlink_state", "nvlink_errors"}.isdisjoint(supported)
    assert "field_values" in supported and "power" in supported
    for t in range(25):
        s = backend.sample(ids[1], T0 + t)
        assert s.energy_j is None and s.pcie_replay_count is None and s.nvlink_up is None
        assert s.power_w is not None
        backend.sample(ids[0], T0 + t)
    # GPU 1 never again; GPU 0 on its cadences, staggered (position 0 of 2): energy every 30 s from T0 + 15,
    # the slow fields (replays, NVLink) every 10 s from T0 + 5
    assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1 + 1 + 1  # probes + T0+15
    assert nvml.calls["nvmlDeviceGetPcieReplayCounter"] == 1 + 1 + 2  # probes + T0+5, T0+15
    # the NVLink probe keeps no value: GPU 0's first round reads it (T0), then T0+5, T0+15
    assert (
        nvml.calls["nvmlDeviceGetNvLinkState"] == (18 + 1) + 18 * 3 + 1
    )  # GPU 0 probe ends at 18; GPU 1 at 0
    assert not backend.errors


def test_other_errors_null_one_field_and_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = _gpus()
    nvml = FakeNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    ids = backend.open()
    gpus[0].failing = {"nvmlDeviceGetTemperature"}
    s = backend.sample(ids[0], T0)
    assert s.temp_c is None and s.power_w is not None
    assert backend.errors["temperature"] == 1
    gpus[0].failing = set()
    assert backend.sample(ids[0], T0 + 1).temp_c == 67.0  # still sampled: not "unsupported"
    assert nvml.calls["nvmlDeviceGetTemperature"] == 2 + 2


def test_pcie_rates_from_the_byte_counters_where_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = _gpus()
    gpus[0].pcie_counters = True
    nvml = FakeNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    ids = backend.open()
    assert "pcie_throughput" not in backend.supported_fields(ids[0])
    assert "pcie_throughput" in backend.supported_fields(ids[1])  # no counters: the 20 ms call
    assert backend.sample(ids[0], T0).pcie_tx_bytes_per_s is None  # a rate needs two samples
    gpus[0].pcie_tx_bytes, gpus[0].pcie_rx_bytes = 4_000_000, 1_000_000
    s = backend.sample(ids[0], T0 + 2)
    assert (s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s) == (2_000_000.0, 500_000.0)
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 2  # GPU 1's probe only, both directions
    assert not backend.errors


def test_clock_reasons_fall_back_to_throttle_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(monkeypatch, _gpus())
    monkeypatch.delattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
    backend = NvmlBackend()
    ids = backend.open()
    assert backend.sample(ids[0], T0).clock_event_reasons == 0x40


def test_gpu_lost_mid_run(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = _gpus()
    FakeNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    ids = backend.open()
    backend.sample(ids[1], T0)
    gpus[1].lost = True
    with pytest.raises(GpuLostError, match="GPU-bbbb"):
        backend.sample(ids[1], T0 + 1)
    assert backend.sample(ids[0], T0 + 1).power_w is not None  # the others go on
    gpus[1].lost = False  # after a reset the GPU answers again
    assert backend.sample(ids[1], T0 + 2).power_w is not None


def test_gpu_lost_at_open_is_probed_later(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = _gpus()
    FakeNvml(monkeypatch, gpus)
    calls = {"n": 0}
    original = pynvml.nvmlDeviceGetUtilizationRates

    def lost_once(h: int) -> Any:
        calls["n"] += h == 1
        if h == 1 and calls["n"] <= 2:  # the probe at open(), then the first sample
            raise pynvml.NVMLError_GpuIsLost()
        return original(h)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lost_once)
    backend = NvmlBackend()
    ids = backend.open()
    assert len(ids) == 2
    with pytest.raises(GpuLostError):
        backend.sample(ids[1], T0)
    assert backend.sample(ids[1], T0 + 1).util_gpu == 97.0
    assert backend.supported_fields(ids[1]) == frozenset(FIELDS)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (pynvml.NVMLError_LibraryNotFound, "libnvidia-ml.so.1 not found"),
        (pynvml.NVMLError_DriverNotLoaded, "driver is not loaded"),
        (pynvml.NVMLError_NoPermission, "nvmlInit failed: Insufficient Permissions"),
    ],
)
def test_no_driver_is_backend_unavailable(
    monkeypatch: pytest.MonkeyPatch, error: type[Exception], message: str
) -> None:
    nvml = FakeNvml(monkeypatch, _gpus())
    nvml.init_error = error
    with pytest.raises(BackendUnavailable, match=message) as info:
        NvmlBackend().open()
    assert "\n" not in str(info.value)


def test_real_pynvml_without_a_driver_is_backend_unavailable() -> None:
    # No NVIDIA driver on the test machines: the real bindings fail to load libnvidia-ml.so.1.
    try:
        backend = NvmlBackend()
        backend.open()
    except BackendUnavailable as exc:
        assert str(exc).startswith("nvml: ")
    else:  # pragma: no cover - a machine with a GPU
        backend.close()


def test_mig_parent_is_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = _gpus()
    gpus[0].mig = True
    gpus[0].mig_children = [[111], [222, 333]]
    FakeNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    ids = backend.open()
    assert ids[0].mig_mode is True and ids[1].mig_mode is False
    assert "utilization" not in backend.supported_fields(ids[0])
    s = backend.sample(ids[0], T0)
    assert s.util_gpu is None
    assert s.power_w is not None and s.ecc_aggregate_uncorrected == 20 and s.nvlink_up is not None
    assert s.pids == (111, 222, 333)
    assert not backend.errors


def test_wait_xids(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(monkeypatch, _gpus())
    backend = NvmlBackend()
    ids = backend.open()
    assert backend.wait_xids(0.01) == []
    nvml.events = [(1, 79), (0, 48)]
    got = backend.wait_xids(0.01)
    assert [(n.gpu, n.xid) for n in got] == [(ids[1], 79), (ids[0], 48)]
    assert "79" in got[0].text
    assert [(n.gpu_instance, n.compute_instance) for n in got] == [(None, None), (None, None)]
    backend.close()


def test_wait_xids_names_the_mig_instance_of_an_event(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(monkeypatch, _gpus())
    backend = NvmlBackend()
    ids = backend.open()
    nvml.events = [(0, 94, 5, 2), (0, 94, 1, 0xFFFFFFFF)]
    got = backend.wait_xids(0.01)
    assert [(n.gpu, n.xid, n.gpu_instance, n.compute_instance) for n in got] == [
        (ids[0], 94, 5, 2),
        (ids[0], 94, 1, None),
    ]
    assert "GPU instance 5, compute instance 2" in got[0].text
    backend.close()


def test_wait_xids_without_event_support(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(monkeypatch, _gpus())
    nvml.events_supported = False
    backend = NvmlBackend()
    backend.open()
    assert backend.wait_xids(0.01) == []
    assert nvml.calls["nvmlEventSetWait_v2"] == 0
    assert nvml.calls["nvmlEventSetFree"] == 1


def test_unidentifiable_gpu_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = _gpus()
    FakeNvml(monkeypatch, gpus)
    original = pynvml.nvmlDeviceGetUUID

    def uuid(h: int) -> str:
        if h == 0:
            raise pynvml.NVMLError_GpuIsLost()
        return str(original(h))

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", uuid)
    backend = NvmlBackend()
    assert [g.uuid for g in backend.open()] == ["GPU-bbbb"]
    assert backend.open_problems and "GPU index 0" in backend.open_problems[0]
