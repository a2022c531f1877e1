"""The real GPU backend: NVML through ``pynvml`` (PyPI package ``nvidia-ml-py``, not the old ``pynvml``).

Every call here blocks (``nvmlDeviceGetPcieThroughput`` alone samples for about 20 ms, ``nvmlEventSetWait``
for up to its timeout): the agent runs them in threads, see :mod:`watchd.gpu.backend` for the contract.

Each field is *probed* once per GPU at :meth:`NvmlBackend.open`: a field whose first call raises
``NotSupported``, ``NoPermission`` or ``FunctionNotFound`` is never called again for that GPU
(:meth:`NvmlBackend.supported_fields` lists the others). After that, ``GpuIsLost`` from any call becomes
:class:`GpuLostError`; any other error leaves that one field None for that one sample and is counted in
:attr:`NvmlBackend.errors` (by field name).

The fields, the calls reading each and their cadence are one table, :mod:`watchd.gpu.nvml_fields`.

Cadence (a 1 s round must cost <= 1 ms CPU per GPU on real NVML): :data:`CADENCE` says how often
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
from typing import Any

from watchd.gpu.backend import XidNotice
from watchd.gpu.model import BackendUnavailable, GpuIdentity, GpuLostError, GpuSample
from watchd.gpu.nvml_device import NvmlDevice
from watchd.gpu.nvml_fields import ENERGY, NVML_FIELDS, ROUND, STATIC
from watchd.gpu.nvml_reads import NvmlReads
from watchd.logs import get_logger
from watchd.xid.pci import normalize_pci

__all__ = ["CADENCE", "FIELDS", "NvmlBackend"]

_log = get_logger("watchd.gpu.nvml")

_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event not tied to a MIG instance


def _instance(value: object) -> int | None:
    """A MIG instance id of an NVML event, None for "no instance" (or a value that is not one)."""
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return None if number == _NO_INSTANCE else number


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


class NvmlBackend:
    """:class:`~watchd.gpu.backend.GpuBackend` on NVML. ``lib`` replaces the ``pynvml`` module (tests)."""

    name = "nvml"
    #: how each field is read, and probed where one read cannot probe it (:mod:`watchd.gpu.nvml_reads`)
    _readers = NvmlReads.readers
    _special_probes = NvmlReads.probes

    def __init__(
        self, lib: Any = None, *, slow_interval_s: float = 10.0, energy_interval_s: float = 30.0
    ) -> None:
        self._lib_override = lib
        self.slow_interval_s = slow_interval_s
        self.energy_interval_s = energy_interval_s
        #: errors per field name (not NotSupported: those fields are simply not called)
        self.errors: Counter[str] = Counter()
        self._lib: Any = None
        self._reads = NvmlReads(None, self.errors)  # over the bindings open() loads
        self._devices: dict[str, NvmlDevice] = {}  # by UUID
        self._by_handle: dict[int, GpuIdentity] = {}
        self._event_set: Any = None
        self._closed = threading.Event()
        self._initialized = False
        #: one line per GPU that could not be enumerated at open()
        self.open_problems: list[str] = []

    # ------------------------------------------------------------------------------------------ open/close

    def open(self) -> list[GpuIdentity]:
        lib = self._lib_override if self._lib_override is not None else _load_pynvml()
        self._lib = lib
        self._reads = NvmlReads(lib, self.errors)
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

    def _enumerate(self, index: int) -> NvmlDevice | None:
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
        return NvmlDevice(identity=identity, handle=handle)

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

    def _probe(self, dev: NvmlDevice) -> None:
        """Call every field once; keep those that do not say "not supported". GpuIsLost propagates."""
        lib = self._lib
        reads = self._reads
        unsupported = reads.unsupported_errors()
        supported: set[str] = set()
        for name in FIELDS:
            special = self._special_probes.get(name)
            try:
                if special is not None:
                    if not special(reads, dev):
                        continue
                else:
                    got = self._readers[name](reads, dev, 0.0)
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

    # ------------------------------------------------------------------------------------------ sampling

    def sample(self, gpu: GpuIdentity, now: float) -> GpuSample:
        dev = self._devices.get(gpu.uuid)
        if dev is None:
            raise KeyError(f"nvml: unknown GPU {gpu.uuid} (not returned by open())")
        lib = self._lib
        reads = self._reads
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
                    got = self._readers[name](reads, dev, now)
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

    def _due(self, dev: NvmlDevice, name: str, cadence: str, now: float) -> bool:
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
    def _energy_estimate(
        dev: NvmlDevice, now: float, power: float | None, real: float | None
    ) -> float | None:
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
            gi = _instance(getattr(data, "gpuInstanceId", _NO_INSTANCE))
            ci = _instance(getattr(data, "computeInstanceId", _NO_INSTANCE))
            if gi is not None:
                text += f" (GPU instance {gi}, compute instance {'-' if ci is None else ci})"
            out.append(XidNotice(gpu, xid, text, gi, ci))
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
