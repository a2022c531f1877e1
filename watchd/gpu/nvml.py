"""The real GPU backend: NVML through ``pynvml`` (PyPI package ``nvidia-ml-py``, not the old ``pynvml``).

Every call here blocks (``nvmlDeviceGetPcieThroughput`` alone samples for about 20 ms, ``nvmlEventSetWait``
for up to its timeout): the agent runs them in threads, see :mod:`watchd.gpu.backend` for the contract.

Each field is *probed* once per GPU at :meth:`NvmlBackend.open`: a field whose first call raises
``NotSupported``, ``NoPermission`` or ``FunctionNotFound`` is never called again for that GPU
(:meth:`NvmlBackend.supported_fields` lists the others). After that, ``GpuIsLost`` from any call becomes
:class:`GpuLostError`; any other error leaves that one field None for that one sample and is counted in
:attr:`NvmlBackend.errors` (by field name).

The fields, the calls reading each and their cadence are one table, :mod:`watchd.gpu.nvml_fields`.

Cadence (issue 20: a 1 s round must cost <= 1 ms CPU per GPU on real NVML): :data:`CADENCE` says how often
each field is read. ``static`` fields (rated SM clock, link maximums) are read once at the probe; ``slow``
ones (power limit, link width/generation, PCIe replays, NVLink state/errors, aggregate ECC) every
``slow_interval_s``; ``energy`` (4 ms a call on an H200) every ``energy_interval_s``, with the integral of the
power readings in between (never decreasing); everything else every round. A field read less often than
every round carries its last value in every sample, so health, summaries and metrics see it each round.
PCIe traffic comes from the cumulative byte counters (fields 197/198, read in the round's one
``nvmlDeviceGetFieldValues`` call) as a rate between rounds; ``nvmlDeviceGetPcieThroughput`` (which samples
for 20 ms per direction) is used only where those fields are not supported, on the slow cadence.
docs/gpu-nvml-cost.md has the table with each field's measured cost.

MIG: ``nvmlDeviceGetCount`` lists physical GPUs only; a MIG-enabled parent is sampled for its device-level
fields (utilization is not supported on it, NVML says so and the probe drops it), and its compute processes
are collected from its MIG devices. MIG devices themselves are never enumerated.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from watchd.gpu.backend import XidNotice
from watchd.gpu.model import BackendUnavailable, GpuIdentity, GpuLostError, GpuSample
from watchd.gpu.nvml_fields import (
    ENERGY,
    FI_NVLINK_RX_KIB,
    FI_NVLINK_TX_KIB,
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    FI_RECOVERY_ACTION,
    NVML_FIELDS,
    ROUND,
    STATIC,
)
from watchd.logs import get_logger
from watchd.xid.pci import normalize_pci

__all__ = ["CADENCE", "FIELDS", "NvmlBackend"]

_log = get_logger("watchd.gpu.nvml")

_SCOPE_ALL_LINKS = 0xFFFFFFFF  # scopeId UINT_MAX: summed over all links
_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event not tied to a MIG instance
_KIB = 1024
_MAX_EVENTS_PER_WAIT = 256

#: The fields probed per GPU, in sampling order (names as :meth:`NvmlBackend.supported_fields` gives them).
FIELDS: tuple[str, ...] = tuple(f.name for f in NVML_FIELDS)

#: How often each field is read (fields not listed: every round). See the module docstring.
CADENCE: dict[str, str] = {f.name: f.cadence for f in NVML_FIELDS if f.cadence != ROUND}


def _load_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise BackendUnavailable(
            "nvml: the Python NVML bindings are not installed (pip install nvidia-ml-py)"
        ) from exc


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _handle_key(handle: Any) -> int:
    """A stable key for an NVML device handle (a ctypes pointer: compare addresses, not objects)."""
    try:
        address = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return address if address is not None else 0


@dataclass(slots=True)
class _Device:
    identity: GpuIdentity
    handle: Any
    probed: bool = False
    supported: set[str] = field(default_factory=set)
    nvlink_links: int = 0
    nvlink_counters: tuple[int, ...] = ()
    field_ids: tuple[int, ...] = ()  # read every round in one nvmlDeviceGetFieldValues call
    recovery_field: int | None = None  # field 230, read on the slow cadence
    nvlink_prev: tuple[float, int, int] | None = None  # (time, tx KiB, rx KiB) of the previous sample
    position: int = 0  # among the GPUs opened: staggers the slow and energy reads over the rounds
    pcie_counters: bool = False  # fields 197/198 supported: PCIe rates from byte counters
    pcie_prev: tuple[float, int, int] | None = None  # (time, tx bytes, rx bytes) of the previous sample
    cache: dict[str, dict[str, Any]] = field(default_factory=dict)  # last values of non-round fields
    due: dict[str, float] = field(default_factory=dict)  # next read of slow/energy fields
    energy_anchor: float | None = None  # J: the last energy counter read
    energy_integral: float = 0.0  # J: the power integral since that read
    energy_out: float | None = None  # J: the last value reported (never decreases)
    power_prev: tuple[float, float] | None = None  # (time, W) of the previous power reading


class NvmlBackend:
    """:class:`~watchd.gpu.backend.GpuBackend` on NVML. ``lib`` replaces the ``pynvml`` module (tests)."""

    name = "nvml"

    def __init__(
        self, lib: Any = None, *, slow_interval_s: float = 10.0, energy_interval_s: float = 30.0
    ) -> None:
        self._lib_override = lib
        self.slow_interval_s = slow_interval_s
        self.energy_interval_s = energy_interval_s
        self._lib: Any = None
        self._devices: dict[str, _Device] = {}  # by UUID
        self._by_handle: dict[int, GpuIdentity] = {}
        self._event_set: Any = None
        self._closed = threading.Event()
        self._initialized = False
        #: errors per field name (not NotSupported: those fields are simply not called)
        self.errors: Counter[str] = Counter()
        #: one line per GPU that could not be enumerated at open()
        self.open_problems: list[str] = []

    # ------------------------------------------------------------------------------------------ open/close

    def open(self) -> list[GpuIdentity]:
        lib = self._lib_override if self._lib_override is not None else _load_pynvml()
        self._lib = lib
        try:
            lib.nvmlInit()
        except lib.NVMLError_LibraryNotFound:
            raise BackendUnavailable(
                "nvml: libnvidia-ml.so.1 not found (no NVIDIA driver installed on this machine)"
            ) from None
        except lib.NVMLError_DriverNotLoaded:
            raise BackendUnavailable("nvml: the NVIDIA kernel driver is not loaded") from None
        except lib.NVMLError as exc:
            raise BackendUnavailable(f"nvml: nvmlInit failed: {exc}") from None
        self._initialized = True
        self._closed.clear()
        try:
            count = int(lib.nvmlDeviceGetCount())
        except lib.NVMLError as exc:
            self.close()
            raise BackendUnavailable(f"nvml: cannot count GPUs: {exc}") from None
        identities: list[GpuIdentity] = []
        for index in range(count):
            dev = self._enumerate(index)
            if dev is None:
                continue
            dev.position = len(identities)
            self._devices[dev.identity.uuid] = dev
            self._by_handle[_handle_key(dev.handle)] = dev.identity
            identities.append(dev.identity)
            try:
                self._probe(dev)
            except lib.NVMLError_GpuIsLost:
                _log.warning("nvml_gpu_lost_at_open", gpu=dev.identity.uuid, index=index)
        self._register_events()
        _log.info("nvml_open", gpus=len(identities), events=self._event_set is not None)
        return identities

    def _enumerate(self, index: int) -> _Device | None:
        lib = self._lib
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(lib.nvmlDeviceGetUUID(handle))
            bus_id = _text(lib.nvmlDeviceGetPciInfo(handle).busId)
        except lib.NVMLError as exc:
            problem = f"nvml: GPU index {index} cannot be identified: {exc}"
            self.open_problems.append(problem)
            _log.warning("nvml_gpu_skipped", index=index, error=str(exc))
            return None
        model = serial = ""
        mig = False
        with contextlib.suppress(lib.NVMLError):
            model = _text(lib.nvmlDeviceGetName(handle))
        with contextlib.suppress(lib.NVMLError):
            serial = _text(lib.nvmlDeviceGetSerial(handle))
        try:
            current, _pending = lib.nvmlDeviceGetMigMode(handle)
            mig = int(current) == int(getattr(lib, "NVML_DEVICE_MIG_ENABLE", 1))
        except lib.NVMLError:
            pass  # NotSupported: no MIG on this GPU
        identity = GpuIdentity(
            index=index,
            uuid=uuid,
            pci_bus_id=normalize_pci(bus_id) or bus_id.lower(),
            model=model,
            serial=serial,
            mig_mode=mig,
        )
        return _Device(identity=identity, handle=handle)

    def _register_events(self) -> None:
        lib = self._lib
        try:
            event_set = lib.nvmlEventSetCreate()
        except lib.NVMLError as exc:
            _log.info("nvml_events_unavailable", error=str(exc))
            return
        registered = 0
        for dev in self._devices.values():
            try:
                lib.nvmlDeviceRegisterEvents(
                    dev.handle, getattr(lib, "nvmlEventTypeXidCriticalError", _XID_EVENT), event_set
                )
                registered += 1
            except lib.NVMLError as exc:  # NotSupported on some GPUs (and in some containers)
                _log.info("nvml_xid_events_unsupported", gpu=dev.identity.uuid, error=str(exc))
        if registered == 0:
            with contextlib.suppress(lib.NVMLError):
                lib.nvmlEventSetFree(event_set)
            return
        self._event_set = event_set

    def close(self) -> None:
        self._closed.set()
        if not self._initialized:
            return
        lib = self._lib
        if self._event_set is not None:
            with contextlib.suppress(lib.NVMLError):
                lib.nvmlEventSetFree(self._event_set)
            self._event_set = None
        with contextlib.suppress(lib.NVMLError):
            lib.nvmlShutdown()
        self._initialized = False
        self._devices.clear()
        self._by_handle.clear()

    # ------------------------------------------------------------------------------------------ probing

    def supported_fields(self, gpu: GpuIdentity) -> frozenset[str]:
        """The fields probed as supported on ``gpu`` (names from :data:`FIELDS`)."""
        dev = self._devices.get(gpu.uuid)
        return frozenset(dev.supported) if dev is not None else frozenset()

    def _unsupported_errors(self) -> tuple[type[BaseException], ...]:
        lib = self._lib
        names = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")
        found = [getattr(lib, n) for n in names if hasattr(lib, n)]
        mismatch = getattr(lib, "NVMLLibraryMismatchError", None)  # unversioned call, old driver
        if mismatch is not None:
            found.append(mismatch)
        return (*found, AttributeError)  # AttributeError: the bindings are too old to have the function

    def _probe(self, dev: _Device) -> None:
        """Call every field once; keep those that do not say "not supported". GpuIsLost propagates."""
        lib = self._lib
        unsupported = self._unsupported_errors()
        supported: set[str] = set()
        for name in FIELDS:
            special = self._special_probes.get(name)
            try:
                if special is not None:
                    if not special(self, dev):
                        continue
                else:
                    got = self._readers[name](self, dev, 0.0)
                    if CADENCE.get(name, ROUND) != ROUND:
                        dev.cache[name] = got
                    if name == "energy":
                        dev.energy_anchor = got["energy_j"]
            except lib.NVMLError_GpuIsLost:
                raise
            except unsupported:
                continue
            except Exception:  # anything else may be transient: keep the field, count it
                self.errors[name] += 1
            supported.add(name)
        dev.supported = supported
        dev.probed = True
        dev.nvlink_prev = None
        dev.pcie_prev = None
        dev.due.clear()
        missing = [n for n in FIELDS if n not in supported]
        _log.debug("nvml_probe", gpu=dev.identity.uuid, unsupported=missing)

    def _probe_nvlink_state(self, dev: _Device) -> bool:
        lib = self._lib
        stop = (lib.NVMLError_NotSupported, lib.NVMLError_InvalidArgument)
        links = 0
        for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                lib.nvmlDeviceGetNvLinkState(dev.handle, link)
            except stop:
                break
            links += 1
        dev.nvlink_links = links
        return links > 0

    def _probe_nvlink_errors(self, dev: _Device) -> bool:
        lib = self._lib
        if dev.nvlink_links == 0:
            return False
        counters = []
        for counter in _nvlink_counters(lib):
            try:
                lib.nvmlDeviceGetNvLinkErrorCounter(dev.handle, 0, counter)
            except lib.NVMLError_GpuIsLost:
                raise
            except (*self._unsupported_errors(), lib.NVMLError_InvalidArgument):
                continue
            except lib.NVMLError:
                pass  # keep it: maybe transient
            counters.append(counter)
        dev.nvlink_counters = tuple(counters)
        return bool(counters)

    def _probe_field_values(self, dev: _Device) -> bool:
        lib = self._lib
        recovery = int(getattr(lib, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", FI_RECOVERY_ACTION))
        pcie = (FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES)
        wanted = (recovery, *pcie, FI_NVLINK_TX_KIB, FI_NVLINK_RX_KIB)
        values = lib.nvmlDeviceGetFieldValues(dev.handle, [self._field_arg(f) for f in wanted])
        not_supported = int(getattr(lib, "NVML_ERROR_NOT_SUPPORTED", 3))
        keep = []
        for fid, value in zip(wanted, values, strict=False):
            ret = int(value.nvmlReturn)
            if ret == not_supported or (ret != 0 and fid != recovery and dev.nvlink_links == 0):
                continue
            keep.append(fid)
        if not all(f in keep for f in pcie):  # both or neither: the throughput call covers both directions
            keep = [f for f in keep if f not in pcie]
        dev.pcie_counters = all(f in keep for f in pcie)
        dev.recovery_field = recovery if recovery in keep else None
        dev.field_ids = tuple(f for f in keep if f != recovery)
        return bool(dev.field_ids)

    def _probe_recovery_action(self, dev: _Device) -> bool:
        if dev.recovery_field is None:
            return False
        dev.cache["recovery_action"] = self._recovery_action(dev, 0.0)
        return True

    def _probe_pcie_throughput(self, dev: _Device) -> bool:
        if dev.pcie_counters:
            return False  # the byte counters are read in the field-values call instead
        dev.cache["pcie_throughput"] = self._pcie_throughput(dev, 0.0)
        return True

    @staticmethod
    def _field_arg(fid: int) -> int | tuple[int, int]:
        return (fid, _SCOPE_ALL_LINKS) if fid in (FI_NVLINK_TX_KIB, FI_NVLINK_RX_KIB) else fid

    _special_probes: dict[str, Callable[[NvmlBackend, _Device], bool]] = {
        "nvlink_state": _probe_nvlink_state,
        "nvlink_errors": _probe_nvlink_errors,
        "field_values": _probe_field_values,
        "pcie_throughput": _probe_pcie_throughput,
        "recovery_action": _probe_recovery_action,
    }

    # ------------------------------------------------------------------------------------------ sampling

    def sample(self, gpu: GpuIdentity, now: float) -> GpuSample:
        dev = self._devices.get(gpu.uuid)
        if dev is None:
            raise KeyError(f"nvml: unknown GPU {gpu.uuid} (not returned by open())")
        lib = self._lib
        values: dict[str, Any] = {}
        energy_read = False
        try:
            if not dev.probed:
                self._probe(dev)
            for name in FIELDS:
                if name not in dev.supported:
                    continue
                cadence = CADENCE.get(name, ROUND)
                if cadence != ROUND and not self._due(dev, name, cadence, now):
                    if name != "energy":  # energy: the power integral below
                        values.update(dev.cache.get(name, {}))
                    continue
                try:
                    got = self._readers[name](self, dev, now)
                except lib.NVMLError_GpuIsLost:
                    raise
                except Exception:
                    self.errors[name] += 1
                    continue
                values.update(got)
                if cadence != ROUND:
                    dev.cache[name] = got
                    energy_read = energy_read or name == "energy"
        except lib.NVMLError_GpuIsLost:
            dev.nvlink_prev = dev.pcie_prev = dev.power_prev = None
            raise GpuLostError(f"GPU {gpu.index} ({gpu.uuid}, {gpu.pci_bus_id}) is lost") from None
        if "energy" in dev.supported:
            values["energy_j"] = self._energy_estimate(
                dev, now, values.get("power_w"), values.get("energy_j") if energy_read else None
            )
        return GpuSample(time=now, gpu=gpu, **values)

    def _due(self, dev: _Device, name: str, cadence: str, now: float) -> bool:
        """Whether a field read less often than every round is to be read in this round."""
        if cadence == STATIC:
            return name not in dev.cache  # read once (again only while the first reads failed)
        interval = self.energy_interval_s if cadence == ENERGY else self.slow_interval_s
        due = dev.due.get(name)
        if due is None:  # the first round after the probe: stagger the next reads over the GPUs
            n = max(1, len(self._devices))
            dev.due[name] = now + interval * (dev.position + 1) / n
            return name not in dev.cache  # read now unless the probe kept its value
        if now >= due or due - now > interval:  # due (or the clock went back)
            dev.due[name] = now + interval
            return True
        return False

    @staticmethod
    def _energy_estimate(dev: _Device, now: float, power: float | None, real: float | None) -> float | None:
        """The energy counter, read every ``energy_interval_s``; in between the last reading plus the
        integral of the power readings since (trapezoids). Never decreases, except on a counter reset."""
        if real is not None:
            if dev.energy_out is not None and real < 0.9 * dev.energy_out:
                dev.energy_out = None  # the counter restarted (driver reload)
            dev.energy_anchor, dev.energy_integral = real, 0.0
        elif power is not None and dev.power_prev is not None and now > dev.power_prev[0]:
            t0, p0 = dev.power_prev
            dev.energy_integral += (p0 + power) / 2.0 * (now - t0)
        if power is not None:
            dev.power_prev = (now, power)
        if dev.energy_anchor is None:
            return None
        estimate = dev.energy_anchor + dev.energy_integral
        if dev.energy_out is not None and estimate < dev.energy_out:
            estimate = dev.energy_out
        dev.energy_out = estimate
        return estimate

    def _utilization(self, dev: _Device, now: float) -> dict[str, Any]:
        u = self._lib.nvmlDeviceGetUtilizationRates(dev.handle)
        return {"util_gpu": float(u.gpu), "util_mem": float(u.memory)}

    def _memory(self, dev: _Device, now: float) -> dict[str, Any]:
        m = self._lib.nvmlDeviceGetMemoryInfo(dev.handle)
        return {"mem_used_bytes": int(m.used), "mem_total_bytes": int(m.total)}

    def _temperature(self, dev: _Device, now: float) -> dict[str, Any]:
        lib = self._lib
        sensor = getattr(lib, "NVML_TEMPERATURE_GPU", 0)
        return {"temp_c": float(lib.nvmlDeviceGetTemperature(dev.handle, sensor))}

    def _power(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"power_w": int(self._lib.nvmlDeviceGetPowerUsage(dev.handle)) / 1000.0}

    def _power_limit(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"power_limit_w": int(self._lib.nvmlDeviceGetEnforcedPowerLimit(dev.handle)) / 1000.0}

    def _energy(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"energy_j": int(self._lib.nvmlDeviceGetTotalEnergyConsumption(dev.handle)) / 1000.0}

    def _sm_clock(self, dev: _Device, now: float) -> dict[str, Any]:
        lib = self._lib
        return {"sm_clock_mhz": float(lib.nvmlDeviceGetClockInfo(dev.handle, _clock_sm(lib)))}

    def _sm_clock_max(self, dev: _Device, now: float) -> dict[str, Any]:
        lib = self._lib
        return {"sm_clock_max_mhz": float(lib.nvmlDeviceGetMaxClockInfo(dev.handle, _clock_sm(lib)))}

    def _clock_event_reasons(self, dev: _Device, now: float) -> dict[str, Any]:
        lib = self._lib
        fn = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is not None:
            try:
                return {"clock_event_reasons": int(fn(dev.handle))}
            except lib.NVMLError_FunctionNotFound:  # new bindings, driver older than r535
                pass
        return {"clock_event_reasons": int(lib.nvmlDeviceGetCurrentClocksThrottleReasons(dev.handle))}

    def _ecc(self, dev: _Device, error_type: int, counter_type: int) -> int:
        return int(self._lib.nvmlDeviceGetTotalEccErrors(dev.handle, error_type, counter_type))

    def _ecc_vc(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"ecc_volatile_corrected": self._ecc(dev, 0, 0)}

    def _ecc_vu(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"ecc_volatile_uncorrected": self._ecc(dev, 1, 0)}

    def _ecc_ac(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"ecc_aggregate_corrected": self._ecc(dev, 0, 1)}

    def _ecc_au(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"ecc_aggregate_uncorrected": self._ecc(dev, 1, 1)}

    def _remapped_rows(self, dev: _Device, now: float) -> dict[str, Any]:
        corr, unc, pending, failure = self._lib.nvmlDeviceGetRemappedRows(dev.handle)
        return {
            "remapped_rows_correctable": int(corr),
            "remapped_rows_uncorrectable": int(unc),
            "remap_pending": bool(pending),
            "remap_failure": bool(failure),
        }

    def _retired_pages_pending(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"retired_pages_pending": bool(self._lib.nvmlDeviceGetRetiredPagesPendingStatus(dev.handle))}

    def _pcie_replay(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"pcie_replay_count": int(self._lib.nvmlDeviceGetPcieReplayCounter(dev.handle))}

    def _pcie_link_gen(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"pcie_link_gen": int(self._lib.nvmlDeviceGetCurrPcieLinkGeneration(dev.handle))}

    def _pcie_link_gen_max(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"pcie_link_gen_max": int(self._lib.nvmlDeviceGetMaxPcieLinkGeneration(dev.handle))}

    def _pcie_link_width(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"pcie_link_width": int(self._lib.nvmlDeviceGetCurrPcieLinkWidth(dev.handle))}

    def _pcie_link_width_max(self, dev: _Device, now: float) -> dict[str, Any]:
        return {"pcie_link_width_max": int(self._lib.nvmlDeviceGetMaxPcieLinkWidth(dev.handle))}

    def _pcie_throughput(self, dev: _Device, now: float) -> dict[str, Any]:
        lib = self._lib
        tx = int(lib.nvmlDeviceGetPcieThroughput(dev.handle, getattr(lib, "NVML_PCIE_UTIL_TX_BYTES", 0)))
        rx = int(lib.nvmlDeviceGetPcieThroughput(dev.handle, getattr(lib, "NVML_PCIE_UTIL_RX_BYTES", 1)))
        return {"pcie_tx_bytes_per_s": float(tx * _KIB), "pcie_rx_bytes_per_s": float(rx * _KIB)}

    def _nvlink_state(self, dev: _Device, now: float) -> dict[str, Any]:
        lib = self._lib
        enabled = int(getattr(lib, "NVML_FEATURE_ENABLED", 1))
        states = tuple(
            int(lib.nvmlDeviceGetNvLinkState(dev.handle, link)) == enabled for link in range(dev.nvlink_links)
        )
        return {"nvlink_up": states}

    def _nvlink_errors(self, dev: _Device, now: float) -> dict[str, Any]:
        lib = self._lib
        total = 0
        answered = 0
        for link in range(dev.nvlink_links):
            for counter in dev.nvlink_counters:
                try:
                    total += int(lib.nvmlDeviceGetNvLinkErrorCounter(dev.handle, link, counter))
                    answered += 1
                except lib.NVMLError_GpuIsLost:
                    raise
                except lib.NVMLError:  # one link may not answer (down): the others still count
                    continue
        if answered == 0:
            raise RuntimeError("no NVLink error counter answered")
        return {"nvlink_errors": total}

    def _field_values(self, dev: _Device, now: float) -> dict[str, Any]:
        lib = self._lib
        results = lib.nvmlDeviceGetFieldValues(dev.handle, [self._field_arg(f) for f in dev.field_ids])
        got: dict[int, int | float] = {}
        for fid, value in zip(dev.field_ids, results, strict=False):
            if int(value.nvmlReturn) == 0:
                got[fid] = _field_number(value)
            else:
                self.errors["field_values"] += 1
        out: dict[str, Any] = {}
        ptx, prx = got.get(FI_PCIE_TX_BYTES), got.get(FI_PCIE_RX_BYTES)
        if ptx is not None and prx is not None:
            pprev = dev.pcie_prev
            dev.pcie_prev = (now, int(ptx), int(prx))
            if pprev is not None and now > pprev[0] and ptx >= pprev[1] and prx >= pprev[2]:
                dt = now - pprev[0]
                out["pcie_tx_bytes_per_s"] = (ptx - pprev[1]) / dt
                out["pcie_rx_bytes_per_s"] = (prx - pprev[2]) / dt
        tx, rx = got.get(FI_NVLINK_TX_KIB), got.get(FI_NVLINK_RX_KIB)
        if tx is not None and rx is not None:
            prev = dev.nvlink_prev
            dev.nvlink_prev = (now, int(tx), int(rx))
            if prev is not None and now > prev[0] and tx >= prev[1] and rx >= prev[2]:
                dt = now - prev[0]
                out["nvlink_tx_bytes_per_s"] = (tx - prev[1]) * _KIB / dt
                out["nvlink_rx_bytes_per_s"] = (rx - prev[2]) * _KIB / dt
        return out

    def _recovery_action(self, dev: _Device, now: float) -> dict[str, Any]:
        if dev.recovery_field is None:
            return {}
        (value,) = self._lib.nvmlDeviceGetFieldValues(dev.handle, [dev.recovery_field])
        if int(value.nvmlReturn) != 0:
            raise RuntimeError(f"field {dev.recovery_field}: NVML return {int(value.nvmlReturn)}")
        return {"recovery_action": int(_field_number(value))}

    def _processes(self, dev: _Device, now: float) -> dict[str, Any]:
        lib = self._lib
        pids: set[int] = set()
        if dev.identity.mig_mode:
            pids.update(self._mig_pids(dev))
        try:
            pids.update(int(p.pid) for p in lib.nvmlDeviceGetComputeRunningProcesses(dev.handle))
        except lib.NVMLError_GpuIsLost:
            raise
        except lib.NVMLError:
            if not dev.identity.mig_mode:  # a MIG parent may refuse: its MIG devices answered above
                raise
        return {"pids": tuple(sorted(pids))}

    def _mig_pids(self, dev: _Device) -> set[int]:
        lib = self._lib
        pids: set[int] = set()
        try:
            slots = int(lib.nvmlDeviceGetMaxMigDeviceCount(dev.handle))
        except lib.NVMLError_GpuIsLost:
            raise
        except lib.NVMLError:
            return pids
        for slot in range(slots):
            try:
                child = lib.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, slot)
                pids.update(int(p.pid) for p in lib.nvmlDeviceGetComputeRunningProcesses(child))
            except lib.NVMLError_GpuIsLost:
                raise
            except lib.NVMLError:  # NotFound: an empty slot
                continue
        return pids

    _readers: dict[str, Callable[[NvmlBackend, _Device, float], dict[str, Any]]] = {
        "utilization": _utilization,
        "memory": _memory,
        "temperature": _temperature,
        "power": _power,
        "power_limit": _power_limit,
        "energy": _energy,
        "sm_clock": _sm_clock,
        "sm_clock_max": _sm_clock_max,
        "clock_event_reasons": _clock_event_reasons,
        "ecc_volatile_corrected": _ecc_vc,
        "ecc_volatile_uncorrected": _ecc_vu,
        "ecc_aggregate_corrected": _ecc_ac,
        "ecc_aggregate_uncorrected": _ecc_au,
        "remapped_rows": _remapped_rows,
        "retired_pages_pending": _retired_pages_pending,
        "pcie_replay": _pcie_replay,
        "pcie_link_gen": _pcie_link_gen,
        "pcie_link_gen_max": _pcie_link_gen_max,
        "pcie_link_width": _pcie_link_width,
        "pcie_link_width_max": _pcie_link_width_max,
        "pcie_throughput": _pcie_throughput,
        "nvlink_state": _nvlink_state,
        "nvlink_errors": _nvlink_errors,
        "field_values": _field_values,
        "recovery_action": _recovery_action,
        "processes": _processes,
    }

    # ------------------------------------------------------------------------------------------ Xid events

    def wait_xids(self, timeout_s: float) -> list[XidNotice]:
        lib = self._lib
        event_set = self._event_set
        if event_set is None or self._closed.is_set():
            self._closed.wait(max(0.0, timeout_s))  # no events on this machine: just pace the caller
            return []
        wait = getattr(lib, "nvmlEventSetWait_v2", None) or lib.nvmlEventSetWait
        out: list[XidNotice] = []
        timeout_ms = max(0, int(timeout_s * 1000))
        while len(out) < _MAX_EVENTS_PER_WAIT:
            try:
                data = wait(event_set, timeout_ms)
            except lib.NVMLError_Timeout:
                break
            except lib.NVMLError as exc:
                # GpuIsLost and friends: the event set may keep failing at once; never spin on it
                self.errors["xid_events"] += 1
                if not out:
                    _log.debug("nvml_event_wait_failed", error=str(exc))
                    self._closed.wait(max(0.0, timeout_s))
                break
            timeout_ms = 0  # drain what is already queued, then return
            if not int(data.eventType) & _XID_EVENT:
                continue
            gpu = self._event_gpu(data.device)
            if gpu is None:
                self.errors["xid_events_unknown_gpu"] += 1
                continue
            xid = int(data.eventData)
            text = f"Xid {xid} reported by NVML"
            gi = int(getattr(data, "gpuInstanceId", _NO_INSTANCE))
            ci = int(getattr(data, "computeInstanceId", _NO_INSTANCE))
            if gi != _NO_INSTANCE:
                text += f" (GPU instance {gi}, compute instance {ci})"
            out.append((gpu, xid, text))
        return out

    def _event_gpu(self, handle: Any) -> GpuIdentity | None:
        gpu = self._by_handle.get(_handle_key(handle))
        if gpu is not None:
            return gpu
        lib = self._lib
        try:  # a MIG device handle: map it to its parent
            parent = lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            gpu = self._by_handle.get(_handle_key(parent))
            if gpu is not None:
                return gpu
        except (lib.NVMLError, AttributeError):
            pass
        try:
            dev = self._devices.get(_text(lib.nvmlDeviceGetUUID(handle)))
        except lib.NVMLError:
            return None
        return dev.identity if dev is not None else None


def _clock_sm(lib: Any) -> int:
    return int(getattr(lib, "NVML_CLOCK_SM", 1))


def _nvlink_counters(lib: Any) -> tuple[int, ...]:
    return (
        int(getattr(lib, "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2)),
        int(getattr(lib, "NVML_NVLINK_ERROR_DL_CRC_DATA", 3)),
        int(getattr(lib, "NVML_NVLINK_ERROR_DL_REPLAY", 0)),
        int(getattr(lib, "NVML_NVLINK_ERROR_DL_RECOVERY", 1)),
    )


def _field_number(value: Any) -> int | float:
    """The number in one ``c_nvmlFieldValue_t``, by its ``valueType``."""
    kind = int(value.valueType)
    v = value.value
    if kind == 0:
        return float(v.dVal)
    attr = {1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(kind, "ullVal")
    return int(getattr(v, attr))
