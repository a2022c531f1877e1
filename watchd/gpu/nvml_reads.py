"""Each NVML field read on one GPU: the call or calls that read it into sample fields, and for the fields a
single read cannot probe (NVLink, the field-values call, PCIe throughput, the recovery action) the probe that
finds what the GPU supports. The backend (:mod:`watchd.gpu.nvml`) decides when each is read; the calls are
declared in :mod:`watchd.gpu.nvml_fields`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from watchd.gpu.nvml_device import NvmlDevice
from watchd.gpu.nvml_fields import (
    FI_NVLINK_RX_KIB,
    FI_NVLINK_TX_KIB,
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    FI_RECOVERY_ACTION,
)

__all__ = ["NvmlReads"]

_SCOPE_ALL_LINKS = 0xFFFFFFFF  # scopeId UINT_MAX: summed over all links
_KIB = 1024


class NvmlReads:
    """The readers and probes over one ``pynvml`` module; read errors of the field-values call are counted in
    ``errors`` (the backend's)."""

    def __init__(self, lib: Any, errors: Counter[str]) -> None:
        self._lib = lib
        self.errors = errors

    # ------------------------------------------------------------------------------------------ probing

    def unsupported_errors(self) -> tuple[type[BaseException], ...]:
        """The errors by which a first call says its field is not supported on this GPU."""
        lib = self._lib
        names = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")
        found = [getattr(lib, n) for n in names if hasattr(lib, n)]
        mismatch = getattr(lib, "NVMLLibraryMismatchError", None)  # unversioned call, old driver
        if mismatch is not None:
            found.append(mismatch)
        return (*found, AttributeError)  # AttributeError: the bindings are too old to have the function

    def _probe_nvlink_state(self, dev: NvmlDevice) -> bool:
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

    def _probe_nvlink_errors(self, dev: NvmlDevice) -> bool:
        lib = self._lib
        if dev.nvlink_links == 0:
            return False
        counters = []
        for counter in _nvlink_counters(lib):
            try:
                lib.nvmlDeviceGetNvLinkErrorCounter(dev.handle, 0, counter)
            except lib.NVMLError_GpuIsLost:
                raise
            except (*self.unsupported_errors(), lib.NVMLError_InvalidArgument):
                continue
            except lib.NVMLError:
                pass  # keep it: maybe transient
            counters.append(counter)
        dev.nvlink_counters = tuple(counters)
        return bool(counters)

    def _probe_field_values(self, dev: NvmlDevice) -> bool:
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

    def _probe_recovery_action(self, dev: NvmlDevice) -> bool:
        if dev.recovery_field is None:
            return False
        dev.cache["recovery_action"] = self._recovery_action(dev, 0.0)
        return True

    def _probe_pcie_throughput(self, dev: NvmlDevice) -> bool:
        if dev.pcie_counters:
            return False  # the byte counters are read in the field-values call instead
        dev.cache["pcie_throughput"] = self._pcie_throughput(dev, 0.0)
        return True

    @staticmethod
    def _field_arg(fid: int) -> int | tuple[int, int]:
        return (fid, _SCOPE_ALL_LINKS) if fid in (FI_NVLINK_TX_KIB, FI_NVLINK_RX_KIB) else fid

    # ------------------------------------------------------------------------------------------ reading

    def _utilization(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        u = self._lib.nvmlDeviceGetUtilizationRates(dev.handle)
        return {"util_gpu": float(u.gpu), "util_mem": float(u.memory)}

    def _memory(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        m = self._lib.nvmlDeviceGetMemoryInfo(dev.handle)
        return {"mem_used_bytes": int(m.used), "mem_total_bytes": int(m.total)}

    def _temperature(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        lib = self._lib
        sensor = getattr(lib, "NVML_TEMPERATURE_GPU", 0)
        return {"temp_c": float(lib.nvmlDeviceGetTemperature(dev.handle, sensor))}

    def _power(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"power_w": int(self._lib.nvmlDeviceGetPowerUsage(dev.handle)) / 1000.0}

    def _power_limit(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"power_limit_w": int(self._lib.nvmlDeviceGetEnforcedPowerLimit(dev.handle)) / 1000.0}

    def _energy(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"energy_j": int(self._lib.nvmlDeviceGetTotalEnergyConsumption(dev.handle)) / 1000.0}

    def _sm_clock(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        lib = self._lib
        return {"sm_clock_mhz": float(lib.nvmlDeviceGetClockInfo(dev.handle, _clock_sm(lib)))}

    def _sm_clock_max(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        lib = self._lib
        return {"sm_clock_max_mhz": float(lib.nvmlDeviceGetMaxClockInfo(dev.handle, _clock_sm(lib)))}

    def _clock_event_reasons(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        lib = self._lib
        fn = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is not None:
            try:
                return {"clock_event_reasons": int(fn(dev.handle))}
            except lib.NVMLError_FunctionNotFound:  # new bindings, driver older than r535
                pass
        return {"clock_event_reasons": int(lib.nvmlDeviceGetCurrentClocksThrottleReasons(dev.handle))}

    def _ecc(self, dev: NvmlDevice, error_type: int, counter_type: int) -> int:
        return int(self._lib.nvmlDeviceGetTotalEccErrors(dev.handle, error_type, counter_type))

    def _ecc_vc(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"ecc_volatile_corrected": self._ecc(dev, 0, 0)}

    def _ecc_vu(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"ecc_volatile_uncorrected": self._ecc(dev, 1, 0)}

    def _ecc_ac(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"ecc_aggregate_corrected": self._ecc(dev, 0, 1)}

    def _ecc_au(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"ecc_aggregate_uncorrected": self._ecc(dev, 1, 1)}

    def _remapped_rows(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        corr, unc, pending, failure = self._lib.nvmlDeviceGetRemappedRows(dev.handle)
        return {
            "remapped_rows_correctable": int(corr),
            "remapped_rows_uncorrectable": int(unc),
            "remap_pending": bool(pending),
            "remap_failure": bool(failure),
        }

    def _retired_pages_pending(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"retired_pages_pending": bool(self._lib.nvmlDeviceGetRetiredPagesPendingStatus(dev.handle))}

    def _pcie_replay(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"pcie_replay_count": int(self._lib.nvmlDeviceGetPcieReplayCounter(dev.handle))}

    def _pcie_link_gen(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"pcie_link_gen": int(self._lib.nvmlDeviceGetCurrPcieLinkGeneration(dev.handle))}

    def _pcie_link_gen_max(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"pcie_link_gen_max": int(self._lib.nvmlDeviceGetMaxPcieLinkGeneration(dev.handle))}

    def _pcie_link_width(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"pcie_link_width": int(self._lib.nvmlDeviceGetCurrPcieLinkWidth(dev.handle))}

    def _pcie_link_width_max(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        return {"pcie_link_width_max": int(self._lib.nvmlDeviceGetMaxPcieLinkWidth(dev.handle))}

    def _pcie_throughput(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        lib = self._lib
        tx = int(lib.nvmlDeviceGetPcieThroughput(dev.handle, getattr(lib, "NVML_PCIE_UTIL_TX_BYTES", 0)))
        rx = int(lib.nvmlDeviceGetPcieThroughput(dev.handle, getattr(lib, "NVML_PCIE_UTIL_RX_BYTES", 1)))
        return {"pcie_tx_bytes_per_s": float(tx * _KIB), "pcie_rx_bytes_per_s": float(rx * _KIB)}

    def _nvlink_state(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        lib = self._lib
        enabled = int(getattr(lib, "NVML_FEATURE_ENABLED", 1))
        states = tuple(
            int(lib.nvmlDeviceGetNvLinkState(dev.handle, link)) == enabled for link in range(dev.nvlink_links)
        )
        return {"nvlink_up": states}

    def _nvlink_errors(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
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

    def _field_values(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
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

    def _recovery_action(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
        if dev.recovery_field is None:
            return {}
        (value,) = self._lib.nvmlDeviceGetFieldValues(dev.handle, [dev.recovery_field])
        if int(value.nvmlReturn) != 0:
            raise RuntimeError(f"field {dev.recovery_field}: NVML return {int(value.nvmlReturn)}")
        return {"recovery_action": int(_field_number(value))}

    def _processes(self, dev: NvmlDevice, now: float) -> dict[str, Any]:
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

    def _mig_pids(self, dev: NvmlDevice) -> set[int]:
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

    #: how each field of :data:`watchd.gpu.nvml.FIELDS` is read
    readers: dict[str, Callable[[NvmlReads, NvmlDevice, float], dict[str, Any]]] = {
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

    #: the fields probed otherwise than by one read (False: not supported on this GPU)
    probes: dict[str, Callable[[NvmlReads, NvmlDevice], bool]] = {
        "nvlink_state": _probe_nvlink_state,
        "nvlink_errors": _probe_nvlink_errors,
        "field_values": _probe_field_values,
        "pcie_throughput": _probe_pcie_throughput,
        "recovery_action": _probe_recovery_action,
    }


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
