"""A cost-faithful stand-in for the ``pynvml`` module, for benchmarks and tests on machines without a GPU.

Inject it where :class:`~watchd.gpu.nvml.NvmlBackend` takes its ``lib`` (or make it ``sys.modules["pynvml"]``
before the agent starts): every call answers like NVML on the GPU it models and *costs* what that call was
measured to cost on real hardware. The costs come from ``nvml_costs.json`` next to this module (measured on
an NVIDIA H200, driver 580.159.04, 2026-12-04: see its ``source``), per function and, for
``nvmlDeviceGetFieldValues``, per field.

Each call adds its modelled CPU time to :attr:`StandinNvml.charged_cpu_ms` (thread-safe), so a test can
assert the agent's modelled cost without timing anything. With ``burn=True`` a call also spends that CPU time
for real (a busy loop on the calling thread's CPU clock) and then sleeps out the rest of its wall time, so a
benchmark of a real agent process sees the CPU and latency real NVML would cost. ``nvmlInit`` optionally
allocates the resident memory that loading ``libnvidia-ml`` costs (``rss=True``).

Its functions and field ids are those of the table the backend reads (:mod:`watchd.gpu.nvml_fields`;
tests/gpu/test_nvml_fields.py holds it to the table). What the modelled H200 does not support raises
``NVMLError_NotSupported`` as NVML does there (NVLink state and error counters, retired pages, NVLink
throughput fields); a GPU marked lost raises ``NVMLError_GpuIsLost`` from every device call;
``nvmlEventSetWait`` blocks for its timeout and raises ``NVMLError_Timeout`` unless an Xid was queued
with :meth:`StandinNvml.queue_xid`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from types import SimpleNamespace
from typing import Any

__all__ = ["CostTable", "StandinGpu", "StandinNvml", "load_costs"]


# ----------------------------------------------------------------------------------------------- errors
# The same names, hierarchy and return codes as pynvml's (nvml.h), so the backend's ``except`` clauses and
# ``NVML_ERROR_*`` comparisons behave as they do against the real bindings.


class NVMLError(Exception):
    value = 999
    text = "Unknown Error"

    def __init__(self, value: int | None = None) -> None:
        if value is not None:
            self.value = value
        super().__init__(self.text)

    def __str__(self) -> str:
        return self.text


def _error(name: str, code: int, text: str) -> type[NVMLError]:
    return type(name, (NVMLError,), {"value": code, "text": text})


NVMLError_InvalidArgument = _error("NVMLError_InvalidArgument", 2, "Invalid Argument")
NVMLError_NotSupported = _error("NVMLError_NotSupported", 3, "Not Supported")
NVMLError_NoPermission = _error("NVMLError_NoPermission", 4, "Insufficient Permissions")
NVMLError_NotFound = _error("NVMLError_NotFound", 6, "Not Found")
NVMLError_DriverNotLoaded = _error("NVMLError_DriverNotLoaded", 9, "Driver Not Loaded")
NVMLError_Timeout = _error("NVMLError_Timeout", 10, "Timeout")
NVMLError_LibraryNotFound = _error("NVMLError_LibraryNotFound", 12, "NVML Shared Library Not Found")
NVMLError_FunctionNotFound = _error("NVMLError_FunctionNotFound", 13, "Function Not Found")
NVMLError_GpuIsLost = _error("NVMLError_GpuIsLost", 15, "GPU is lost")
NVMLError_Unknown = _error("NVMLError_Unknown", 999, "Unknown Error")


class NVMLLibraryMismatchError(Exception):
    """pynvml's: a versioned call the driver's library lacks (never raised: the modelled driver is new)."""


# ----------------------------------------------------------------------------------------------- costs


@dataclass(frozen=True, slots=True)
class Cost:
    cpu_ms: float
    wall_ms: float


@dataclass(frozen=True, slots=True)
class CostTable:
    source: str
    calls: dict[str, Cost]
    fields: dict[int, Cost]
    field_default: Cost
    unmeasured: Cost
    not_supported: frozenset[str]  # function names, and "field:<id>"
    nvml_init_rss_mib: float  # what nvmlInit adds to a process that has the agent's imports
    rss_mib: dict[str, float]

    def call(self, name: str) -> Cost:
        return self.calls.get(name, self.unmeasured)

    def field(self, fid: int) -> Cost:
        return self.fields.get(fid, self.field_default)


def _cost(d: dict[str, Any]) -> Cost:
    return Cost(float(d["cpu_ms"]), float(d["wall_ms"]))


def load_costs(text: str | None = None) -> CostTable:
    """The cost table (``nvml_costs.json`` shipped with watchd, or ``text`` in its format)."""
    if text is None:
        text = resources.files("watchd.gpu").joinpath("nvml_costs.json").read_text()
    raw = json.loads(text)
    rss = {k: float(v) for k, v in raw["rss_mib"].items()}
    unmeasured = float(raw["unmeasured_ms"])
    return CostTable(
        source=str(raw["source"]),
        calls={k: _cost(v) for k, v in raw["calls"].items()},
        fields={int(k): _cost(v) for k, v in raw["fields"].items()},
        field_default=_cost(raw["field_default"]),
        unmeasured=Cost(unmeasured, unmeasured),
        not_supported=frozenset(raw["not_supported"]),
        nvml_init_rss_mib=rss["agent_imports_nvml_init"] - rss["agent_imports"],
        rss_mib=rss,
    )


# ----------------------------------------------------------------------------------------------- GPUs


@dataclass
class StandinGpu:
    """One modelled GPU; tests change its fields to make it hot, busy, lost ..."""

    uuid: str
    bus_id: str
    name: str = "NVIDIA H200"
    util: int = 98
    power_mw: int = 690_000
    power_limit_mw: int = 700_000
    mem_total: int = 143_771_090_944
    mem_used: int = 120 * 2**30
    temp_c: int = 61
    sm_clock: int = 1980
    sm_clock_max: int = 1980
    link_gen: int = 5
    link_gen_max: int = 5
    link_width: int = 16
    link_width_max: int = 16
    pcie_tx_bps: float = 2.0e9
    pcie_rx_bps: float = 1.0e9
    pids: tuple[int, ...] = ()
    lost: bool = False
    nvlinks: int = 0  # > 0: the GPU has NVLinks (then the NVLink calls are supported)
    unsupported: set[str] = field(default_factory=set)  # more function names raising NotSupported
    energy_mj: float = 1.0e9  # the counter has run a while
    energy_at: float = 0.0  # modelled time of its last update


_FIELD_TYPE_ULL = 3
_XID_EVENT = 0x8


class StandinNvml:
    """The stand-in module. ``clock`` gives the modelled time (energy and byte counters grow with it)."""

    # constants the backend reads (pynvml's values)
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_FEATURE_ENABLED = 1
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_ERROR_DL_REPLAY = 0
    NVML_NVLINK_ERROR_DL_RECOVERY = 1
    NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
    NVML_NVLINK_ERROR_DL_CRC_DATA = 3
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
    nvmlEventTypeXidCriticalError = _XID_EVENT

    NVMLError = NVMLError
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Unknown = NVMLError_Unknown
    NVMLLibraryMismatchError = NVMLLibraryMismatchError

    def __init__(
        self,
        gpus: list[StandinGpu],
        *,
        costs: CostTable | None = None,
        burn: bool = False,
        rss: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gpus = gpus
        self.costs = costs or load_costs()
        self.burn = burn
        self.rss = rss
        self.clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()
        self.charged_cpu_ms = 0.0
        self.charged_wall_ms = 0.0
        self.calls: Counter[str] = Counter()
        self._xids: list[tuple[int, int]] = []
        self._ballast: bytearray | None = None
        self.initialized = False

    @classmethod
    def h200(cls, count: int, **kwargs: Any) -> StandinNvml:
        """``count`` H200s as measured: one PCIe link each, no NVLink (the measured VM had none)."""
        gpus = [
            StandinGpu(
                uuid=f"GPU-5ad0c0de-0000-4000-8000-{i:012x}", bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0"
            )
            for i in range(count)
        ]
        return cls(gpus, **kwargs)

    # ------------------------------------------------------------------------------------------ costs

    def _charge(self, name: str, cost: Cost) -> None:
        with self._lock:
            self.calls[name] += 1
            self.charged_cpu_ms += cost.cpu_ms
            self.charged_wall_ms += cost.wall_ms
        if not self.burn:
            return
        end = time.thread_time() + cost.cpu_ms / 1000.0
        started = time.monotonic()
        while time.thread_time() < end:
            pass
        rest = cost.wall_ms / 1000.0 - (time.monotonic() - started)
        if rest > 0:
            time.sleep(rest)

    def take_charged_ms(self) -> float:
        """The modelled CPU ms charged since the last call (or since the start)."""
        with self._lock:
            out, self.charged_cpu_ms = self.charged_cpu_ms, 0.0
        return out

    def _device(self, name: str, handle: int) -> StandinGpu:
        self._charge(name, self.costs.call(name))
        if not self.initialized:
            raise NVMLError_Unknown()  # NVML answers Uninitialized; the backend never calls before init
        if not isinstance(handle, int) or not 0 <= handle < len(self.gpus):
            raise NVMLError_InvalidArgument()
        gpu = self.gpus[handle]
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        if name in gpu.unsupported or (name in self.costs.not_supported and not self._nvlink_call(gpu, name)):
            raise NVMLError_NotSupported()
        return gpu

    @staticmethod
    def _nvlink_call(gpu: StandinGpu, name: str) -> bool:
        return gpu.nvlinks > 0 and "NvLink" in name

    def _elapsed(self) -> float:
        return max(0.0, self.clock() - self._t0)

    # ------------------------------------------------------------------------------------------ library

    def nvmlInit(self) -> None:
        self._charge("nvmlInit", self.costs.call("nvmlInit"))
        if self.rss and self._ballast is None:  # the resident memory libnvidia-ml costs, touched
            self._ballast = bytearray(b"\x01") * int(self.costs.nvml_init_rss_mib * 2**20)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._charge("nvmlShutdown", self.costs.call("nvmlShutdown"))
        self.initialized = False
        self._ballast = None

    def nvmlDeviceGetCount(self) -> int:
        self._charge("nvmlDeviceGetCount", self.costs.call("nvmlDeviceGetCount"))
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._device("nvmlDeviceGetHandleByIndex", index)
        return index

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._device("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self._device("nvmlDeviceGetPciInfo", h).bus_id)

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._device("nvmlDeviceGetName", h).name

    def nvmlDeviceGetSerial(self, h: int) -> str:
        self._device("nvmlDeviceGetSerial", h)
        return f"165{h:010d}"

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        self._device("nvmlDeviceGetMigMode", h)
        return [0, 0]

    # ------------------------------------------------------------------------------------------ readings

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        g = self._device("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g.util, memory=g.util // 2)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        g = self._device("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=g.mem_total, used=g.mem_used, free=g.mem_total - g.mem_used)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._device("nvmlDeviceGetTemperature", h).temp_c

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        g = self._device("nvmlDeviceGetPowerUsage", h)
        self._energy_mj(g)  # the energy so far was drawn at the previous power
        return g.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self._device("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        g = self._device("nvmlDeviceGetTotalEnergyConsumption", h)
        return self._energy_mj(g)

    def _energy_mj(self, g: StandinGpu) -> int:
        """The energy counter: the power drawn integrated over the modelled time (a step at each change)."""
        now = self._elapsed()
        with self._lock:
            g.energy_mj += g.power_mw * max(0.0, now - g.energy_at)
            g.energy_at = now
            return int(g.energy_mj)

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return self._device("nvmlDeviceGetClockInfo", h).sm_clock

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return self._device("nvmlDeviceGetMaxClockInfo", h).sm_clock_max

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        self._device("nvmlDeviceGetCurrentClocksEventReasons", h)
        return 0

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        self._device("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return 0

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter_type: int) -> int:
        self._device("nvmlDeviceGetTotalEccErrors", h)
        return 0

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        self._device("nvmlDeviceGetRemappedRows", h)
        return (0, 0, 0, 0)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        self._device("nvmlDeviceGetRetiredPagesPendingStatus", h)
        return 0

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        self._device("nvmlDeviceGetPcieReplayCounter", h)
        return 0

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._device("nvmlDeviceGetCurrPcieLinkGeneration", h).link_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._device("nvmlDeviceGetMaxPcieLinkGeneration", h).link_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._device("nvmlDeviceGetCurrPcieLinkWidth", h).link_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._device("nvmlDeviceGetMaxPcieLinkWidth", h).link_width_max

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        g = self._device("nvmlDeviceGetPcieThroughput", h)
        rate = g.pcie_tx_bps if counter == self.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_bps
        return int(rate / 1024)  # KB/s

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        g = self._device("nvmlDeviceGetNvLinkState", h)
        if link >= g.nvlinks:
            raise NVMLError_InvalidArgument()
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        g = self._device("nvmlDeviceGetNvLinkErrorCounter", h)
        if link >= g.nvlinks:
            raise NVMLError_InvalidArgument()
        return 0

    def nvmlDeviceGetFieldValues(self, h: int, field_ids: list[Any]) -> list[Any]:
        """Charged the sum of its fields' costs (the table's ``fields`` / ``field_default``)."""
        ids = [(f[0] if isinstance(f, tuple) else int(f)) for f in field_ids]
        cpu = sum(self.costs.field(f).cpu_ms for f in ids)
        wall = sum(self.costs.field(f).wall_ms for f in ids)
        g = self._device_cost("nvmlDeviceGetFieldValues", h, Cost(cpu, wall))
        now = self._elapsed()
        out = []
        for fid in ids:
            supported = f"field:{fid}" not in self.costs.not_supported or (
                g.nvlinks > 0 and fid in (138, 139)
            )
            value: int | None = None
            if supported:
                value = {
                    83: self._energy_mj(g),
                    197: int(g.pcie_tx_bps * now),
                    198: int(g.pcie_rx_bps * now),
                    230: 0,
                    138: int(g.nvlinks * 20e9 * now / 1024),
                    139: int(g.nvlinks * 20e9 * now / 1024),
                }.get(fid)
            if value is None:
                out.append(
                    SimpleNamespace(fieldId=fid, nvmlReturn=self.NVML_ERROR_NOT_SUPPORTED, valueType=0)
                )
            else:
                out.append(
                    SimpleNamespace(
                        fieldId=fid,
                        nvmlReturn=0,
                        valueType=_FIELD_TYPE_ULL,
                        value=SimpleNamespace(ullVal=value),
                    )
                )
        return out

    def _device_cost(self, name: str, h: int, cost: Cost) -> StandinGpu:
        self._charge(name, cost)
        if not isinstance(h, int) or not 0 <= h < len(self.gpus):
            raise NVMLError_InvalidArgument()
        gpu = self.gpus[h]
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        if name in gpu.unsupported:
            raise NVMLError_NotSupported()
        return gpu

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        g = self._device("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=p, usedGpuMemory=0) for p in g.pids]

    # MIG: the modelled GPUs have it disabled (nvmlDeviceGetMigMode answers 0), so no MIG device exists

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        self._device("nvmlDeviceGetMaxMigDeviceCount", h)
        return 0  # NVML: zero where MIG is not enabled

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, index: int) -> int:
        self._device("nvmlDeviceGetMigDeviceHandleByIndex", h)
        raise NVMLError_NotFound()

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: int) -> int:
        self._device("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", h)
        raise NVMLError_InvalidArgument()  # not a MIG device handle

    # ------------------------------------------------------------------------------------------ events

    def queue_xid(self, index: int, xid: int) -> None:
        with self._lock:
            self._xids.append((index, xid))

    def nvmlEventSetCreate(self) -> str:
        self._charge("nvmlEventSetCreate", self.costs.call("nvmlEventSetCreate"))
        return "standin-event-set"

    def nvmlDeviceRegisterEvents(self, h: int, types: int, event_set: str) -> None:
        self._device("nvmlDeviceRegisterEvents", h)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        self._charge("nvmlEventSetWait_v2", self.costs.call("nvmlEventSetWait_v2"))
        with self._lock:
            queued = self._xids.pop(0) if self._xids else None
        if queued is None:
            time.sleep(timeout_ms / 1000.0)  # blocks for its timeout, as NVML does
            raise NVMLError_Timeout()
        index, xid = queued
        return SimpleNamespace(
            device=index,
            eventType=_XID_EVENT,
            eventData=xid,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )

    def nvmlEventSetFree(self, event_set: str) -> None:
        self._charge("nvmlEventSetFree", self.costs.call("nvmlEventSetFree"))
