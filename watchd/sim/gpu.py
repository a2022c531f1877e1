"""A deterministic GPU backend driven by a :class:`~watchd.sim.scenario.Scenario`.

Every reading is a pure function of (scenario, injected faults, GPU index, ``now - start_time``): the same
inputs always give the same sample, whatever was sampled before. Noise is drawn from a generator seeded with
``(seed, GPU index, time to the millisecond)``.

Kernel-log lines are the side effect: the first time ``sample()`` or ``wait_xids()`` sees time at or past a
fault's ``at``, its lines go to ``on_kernel_log`` (once, in fault order), and its Xids are queued for
``wait_xids()``. ``on_kernel_log`` is called from the thread that called ``sample()``/``wait_xids()``, never
with the backend's lock held: from a worker thread, hand the line to the event loop thread-safely
(``loop.call_soon_threadsafe(source.inject_log, line)``).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from watchd.clock import Clock
from watchd.gpu.backend import XidNotice
from watchd.gpu.model import (
    CLOCK_GPU_IDLE,
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_SW_THERMAL,
    GpuIdentity,
    GpuLostError,
    GpuSample,
)
from watchd.sim.scenario import (
    EccDbe,
    FallOffBus,
    Fault,
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
    check_faults,
)

__all__ = ["FakeGpuBackend"]

# The bus numbers of the eight GPUs of an HGX H100 board, then made-up ones.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_GIB = 1024**3
_APP_XIDS = frozenset({13, 31, 43, 45, 68, 69, 94})

_XID_TEXT: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2e_40000000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    45: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 1, "
    "subpartition 0.",
    63: "Row Remapper: New row (0x00000000000f2a40) was marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row (0x00000000000f2a40): no spare rows available.",
    74: "NVLink: fatal error detected on link 0(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error.",
    95: "Uncontained ECC error.",
    109: "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x3c000",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
    "(0x20800a4c 0x4).",
}


@dataclass(frozen=True, slots=True)
class _Emission:
    gpu: GpuIdentity
    lines: tuple[str, ...]
    xids: tuple[tuple[int, str], ...]


class FakeGpuBackend:
    """:class:`~watchd.gpu.backend.GpuBackend` over a scenario. ``clock`` (optional) gives ``wait_xids`` its
    notion of now; without one it uses the latest ``now`` passed to ``sample()``."""

    name = "fake"

    def __init__(
        self,
        scenario: Scenario,
        start_time: float,
        on_kernel_log: Callable[[str], None] | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.scenario = scenario
        self.start_time = start_time
        self._on_kernel_log = on_kernel_log
        self._clock = clock
        self._spec = scenario.gpus.preset
        self._faults: list[Fault] = list(scenario.faults)
        self._emitted: set[int] = set()  # indices into _faults
        self._announced: set[int] = set()  # GPUs whose "NVRM: GPU at PCI:..." line was written
        self._xids: list[XidNotice] = []
        self._observed: float | None = None
        self._closed = False
        self._cond = threading.Condition()
        self.gpus: tuple[GpuIdentity, ...] = tuple(self._identity(i) for i in range(scenario.gpus.count))
        self._reset_at: dict[int, float] = {}  # GPU index -> scenario time of its last reset
        #: every kernel line emitted so far, in order (also given to on_kernel_log)
        self.kernel_log: list[str] = []

    # ------------------------------------------------------------------------------------------ identity

    def _identity(self, index: int) -> GpuIdentity:
        rng = random.Random(f"{self.scenario.seed}:identity:{index}")
        uuid = uuidlib.UUID(int=rng.getrandbits(128), version=4)
        bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else 0xE0 + index - len(_HGX_BUSES)
        return GpuIdentity(
            index=index,
            uuid=f"GPU-{uuid}",
            pci_bus_id=f"0000:{bus:02x}:00.0",
            model=self._spec.nvml_name,
            serial=f"1654{rng.randrange(10**9):09d}",
            mig_mode=index in self.scenario.gpus.mig,
        )

    # ------------------------------------------------------------------------------------------ backend API

    def open(self) -> list[GpuIdentity]:
        with self._cond:
            self._closed = False
        return list(self.gpus)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def inject(self, fault: Fault, now: float | None = None) -> None:
        """Add a fault at run time; with ``now``, it starts at ``now`` (its own ``at`` is replaced)."""
        if now is not None:
            fault = fault.model_copy(update={"at": max(0.0, now - self.start_time)})
        problem = check_faults(self.scenario.gpus, [fault])
        if problem is not None:
            raise ValueError(problem.replace("faults.0.", "fault "))
        with self._cond:
            self._faults.append(fault)
            self._cond.notify_all()

    def sample(self, gpu: GpuIdentity, now: float) -> GpuSample:
        self._observe(now)
        t = now - self.start_time
        i = gpu.index
        faults = [f for f in self._faults_of(i) if f.started(t)]
        if any(isinstance(f, FallOffBus) and f.active(t) for f in faults):
            raise GpuLostError(f"GPU {i} ({gpu.uuid}, {gpu.pci_bus_id}) is lost")
        return self._reading(gpu, now, t, faults)

    def wait_xids(self, timeout_s: float) -> list[XidNotice]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            if self._clock is not None:
                self._observe(self._clock.now())
            with self._cond:
                if self._xids:
                    out, self._xids = self._xids, []
                    return out
                remaining = deadline - time.monotonic()
                if self._closed or remaining <= 0:
                    return []
                # with a clock, look at it again now and then; without one, sample() wakes us
                self._cond.wait(min(remaining, 0.05) if self._clock is not None else remaining)

    # ------------------------------------------------------------------------------------------ faults

    def _faults_of(self, index: int) -> list[Fault]:
        count = self.scenario.gpus.count
        reset = self._reset_at.get(index)
        return [
            f for f in list(self._faults) if index in f.gpu_indices(count) and (reset is None or f.at > reset)
        ]

    # ------------------------------------------------------------------------------------------ a GPU reset

    def processes(self, index: int) -> tuple[int, ...]:
        """The compute processes holding GPU ``index`` (the scenario's training job holds every GPU)."""
        return self._pids(index) if self.scenario.load == "training" else ()

    def lost(self, index: int, now: float) -> bool:
        """Whether GPU ``index`` has fallen off the bus at ``now`` (no reset brings it back)."""
        t = now - self.start_time
        return any(isinstance(f, FallOffBus) and f.active(t) for f in self._faults_of(index) if f.started(t))

    def reset(self, indices: Iterable[int], now: float) -> None:
        """A GPU reset of ``indices`` at ``now``: the faults that had started on them are over (their kernel
        lines and Xids stay emitted); faults due later still come."""
        with self._cond:
            for index in indices:
                self._reset_at[index] = now - self.start_time

    def _observe(self, now: float) -> None:
        """Emit the kernel lines and Xids of every fault that has started by ``now`` (once each)."""
        lines: list[str] = []
        with self._cond:
            if self._observed is None or now > self._observed:
                self._observed = now
            t = self._observed - self.start_time
            due = sorted(
                (n for n, f in enumerate(self._faults) if n not in self._emitted and f.started(t)),
                key=lambda n: (self._faults[n].at, n),
            )
            for n in due:
                self._emitted.add(n)
                for gpu_index in self._faults[n].gpu_indices(self.scenario.gpus.count):
                    emission = self._emission(self._faults[n], self.gpus[gpu_index])
                    if emission.xids and gpu_index not in self._announced:
                        self._announced.add(gpu_index)
                        bdf = emission.gpu.pci_bus_id[:-2]
                        lines.append(f"NVRM: GPU at PCI:{bdf}: {emission.gpu.uuid}")
                    lines.extend(emission.lines)
                    self._xids.extend(XidNotice(emission.gpu, code, text) for code, text in emission.xids)
            if due:
                self._cond.notify_all()
            self.kernel_log.extend(lines)
        if self._on_kernel_log is not None:
            for line in lines:
                self._on_kernel_log(line)

    def _emission(self, fault: Fault, gpu: GpuIdentity) -> _Emission:
        xids: list[tuple[int, str, int | None, str | None]] = []
        pid = self._pids(gpu.index)[0] if self.scenario.load == "training" else None
        if isinstance(fault, XidFault):
            text = fault.text or _XID_TEXT.get(fault.code, f"Xid {fault.code}")
            app = fault.code in _APP_XIDS
            xids.append(
                (
                    fault.code,
                    text,
                    fault.pid if fault.pid is not None else (pid if app else None),
                    fault.process if fault.process is not None else ("python3" if app and pid else None),
                )
            )
        elif isinstance(fault, FallOffBus):
            xids.append((79, _XID_TEXT[79], None, None))
        elif isinstance(fault, EccDbe):
            xids.append((48, _XID_TEXT[48], None, None))
            code = 63 if fault.remap == "pending" else 64
            xids.append((code, _XID_TEXT[code], None, None))
        elif isinstance(fault, RowRemapFailure):
            xids.append((64, _XID_TEXT[64], None, None))
        elif isinstance(fault, NvlinkDown):
            for link in fault.links:
                text = f"NVLink: fatal error detected on link {link}(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"
                xids.append((74, text, None, None))
        bdf = gpu.pci_bus_id[:-2]  # the kernel prints PCI:dddd:bb:dd
        lines = tuple(
            f"NVRM: Xid (PCI:{bdf}): {code}, pid={p if p is not None else '<unknown>'}, "
            f"name={name if name is not None else '<unknown>'}, {text}"
            for code, text, p, name in xids
        )
        return _Emission(gpu, lines, tuple((code, text) for code, text, _p, _n in xids))

    # ------------------------------------------------------------------------------------------ readings

    def _pids(self, index: int) -> tuple[int, ...]:
        return (10_000 + (self.scenario.seed * 7919) % 50_000 + index,)

    def _base(self, index: int, t: float, faults: Iterable[Fault]) -> tuple[float, bool, bool]:
        """(mean power in W, training, spinning) for the load and the load-changing faults at ``t``."""
        spec = self._spec
        training = self.scenario.load == "training"
        power = spec.tdp_w * (0.80 if training else 0.10)
        spinning = False
        for f in faults:
            if not f.active(t):
                continue
            if isinstance(f, NcclHang):
                power, spinning = spec.tdp_w * 0.35, True
            elif isinstance(f, StalledRank):
                power, training = spec.tdp_w * 0.13, False
        for f in faults:
            if not f.active(t):
                continue
            if isinstance(f, PowerBrake):
                power *= 0.5
            elif isinstance(f, HwSlowdown):
                power *= 0.7
            elif isinstance(f, Thermal):
                power *= 0.85
            elif isinstance(f, Straggler):
                power *= 0.93
        return power, training, spinning

    def _energy_j(self, index: int, t: float, faults: list[Fault]) -> float:
        """Energy since "driver load": an offset plus the integral of the mean power (piecewise constant)."""
        offset = random.Random(f"{self.scenario.seed}:energy:{index}").uniform(1e7, 1e8)
        end = max(0.0, t)
        cuts = {0.0, end}
        for f in faults:
            for edge in (f.at, f.at + (f.duration or 0.0)):
                if 0.0 < edge < end:
                    cuts.add(edge)
        points = sorted(cuts)
        total = 0.0
        for a, b in itertools.pairwise(points):
            total += self._base(index, (a + b) / 2, faults)[0] * (b - a)
        return offset + total

    def _reading(self, gpu: GpuIdentity, now: float, t: float, faults: list[Fault]) -> GpuSample:
        spec = self._spec
        i = gpu.index
        rng = random.Random(f"{self.scenario.seed}:{i}:{t:.3f}")
        mean_power, training, spinning = self._base(i, t, faults)
        active = [f for f in faults if f.active(t)]

        mem_total = int(spec.memory_gb * _GIB)
        reasons = 0
        if spinning:
            util = 100.0 - rng.choice((0.0, 0.0, 1.0))
            util_mem = float(rng.randint(0, 2))
            power = mean_power * rng.uniform(0.95, 1.05)
            clock = spec.sm_clock_max_mhz - 15.0 * rng.randint(0, 2)
            nvlink_bps = rng.uniform(0.0, 2e5)
            pcie_bps = rng.uniform(0.0, 1e5)
            temp = 45.0 + rng.uniform(-1.0, 1.0)
            mem_used = int(mem_total * 0.9)
            pids = self._pids(i)
        elif training:
            util = min(100.0, float(round(97.5 + rng.uniform(-2.5, 2.5))))
            util_mem = float(round(45.0 + rng.uniform(-10.0, 10.0)))
            band = 0.1 * spec.tdp_w  # healthy training: 0.7-0.9 TDP
            power = min(
                mean_power + band, max(mean_power - band, mean_power + rng.gauss(0.0, 0.035 * spec.tdp_w))
            )
            clock = spec.sm_clock_max_mhz - 15.0 * rng.randint(0, 3)
            nvlink_bps = 1.2e11 * (spec.nvlinks / 18) * rng.uniform(0.85, 1.15)
            pcie_bps = 6e9 * rng.uniform(0.8, 1.2)
            temp = 62.0 + 40.0 * (power / spec.tdp_w - 0.7) + rng.uniform(-1.5, 1.5)
            mem_used = int(mem_total * rng.uniform(0.88, 0.92))
            pids = self._pids(i)
        else:  # idle, or a stalled rank (context loaded, nothing running)
            stalled = any(isinstance(f, StalledRank) for f in active)
            util = 0.0
            util_mem = 0.0
            power = mean_power * rng.uniform(0.95, 1.05)
            clock = spec.sm_clock_max_mhz if stalled else min(345.0, spec.sm_clock_max_mhz)
            clock -= 15.0 * rng.randint(0, 1) if stalled else 0.0
            nvlink_bps = rng.uniform(0.0, 1e4)
            pcie_bps = rng.uniform(0.0, 1e5)
            temp = (40.0 if stalled else 31.0) + rng.uniform(-1.5, 1.5)
            mem_used = int(mem_total * 0.9) if stalled else 512 * 1024**2
            pids = self._pids(i) if stalled else ()
            reasons |= CLOCK_GPU_IDLE

        link_gen = spec.pcie_gen_max if (training or spinning) else 1  # real GPUs downshift the link at idle
        link_width = spec.pcie_width_max
        nvlink_up = [True] * spec.nvlinks
        nvlink_errors = 0
        ecc_vol_unc = ecc_agg_unc = remapped_unc = 0
        remap_pending = remap_failure = False
        recovery = 0
        for f in faults:  # started faults, active or over: counters stay raised
            if isinstance(f, EccDbe):
                ecc_agg_unc += f.count
                remapped_unc += f.count
                if f.active(t):
                    ecc_vol_unc += f.count
                    remap_pending = remap_pending or f.remap == "pending"
                    remap_failure = remap_failure or f.remap == "failure"
            elif isinstance(f, NvlinkDown):
                nvlink_errors += 3 * len(f.links)
        for f in active:
            if f.recovery_action is not None:
                recovery = f.recovery_action
            if isinstance(f, Thermal):
                reasons |= CLOCK_SW_THERMAL | ((CLOCK_HW_THERMAL | CLOCK_HW_SLOWDOWN) if f.hw else 0)
                clock *= f.clock_factor
                temp = f.temp_c + rng.uniform(-1.0, 1.0)
            elif isinstance(f, PowerBrake):
                reasons |= CLOCK_HW_SLOWDOWN | CLOCK_HW_POWER_BRAKE
                clock *= f.clock_factor
            elif isinstance(f, HwSlowdown):
                reasons |= CLOCK_HW_SLOWDOWN
                clock *= f.clock_factor
            elif isinstance(f, Straggler):
                clock *= f.clock_factor
            elif isinstance(f, RowRemapFailure):
                remap_failure = True
            elif isinstance(f, NvlinkDown):
                for link in f.links:
                    nvlink_up[link] = False
            elif isinstance(f, PcieDowntrain):
                link_width = f.width or max(1, spec.pcie_width_max // 2)
                pcie_bps *= link_width / spec.pcie_width_max
        if spec.nvlinks:
            nvlink_bps *= sum(nvlink_up) / spec.nvlinks

        has_nvlink = spec.nvlinks > 0
        return GpuSample(
            time=now,
            gpu=gpu,
            util_gpu=None if gpu.mig_mode else util,  # NVML: not supported on a MIG-enabled GPU
            util_mem=None if gpu.mig_mode else util_mem,
            mem_used_bytes=mem_used,
            mem_total_bytes=mem_total,
            temp_c=float(round(temp)),
            power_w=round(power, 3),
            power_limit_w=spec.tdp_w,
            energy_j=round(self._energy_j(i, t, faults), 3),
            sm_clock_mhz=float(round(clock)),
            sm_clock_max_mhz=spec.sm_clock_max_mhz,
            clock_event_reasons=reasons,
            ecc_volatile_corrected=0,
            ecc_volatile_uncorrected=ecc_vol_unc,
            ecc_aggregate_corrected=0,
            ecc_aggregate_uncorrected=ecc_agg_unc,
            remapped_rows_correctable=0,
            remapped_rows_uncorrectable=remapped_unc,
            remap_pending=remap_pending,
            remap_failure=remap_failure,
            retired_pages_pending=False,
            pcie_replay_count=0,
            pcie_link_gen=link_gen,
            pcie_link_gen_max=spec.pcie_gen_max,
            pcie_link_width=link_width,
            pcie_link_width_max=spec.pcie_width_max,
            pcie_tx_bytes_per_s=round(pcie_bps, 1),
            pcie_rx_bytes_per_s=round(pcie_bps * 0.9, 1),
            nvlink_up=tuple(nvlink_up) if has_nvlink else None,
            nvlink_errors=nvlink_errors if has_nvlink else None,
            nvlink_tx_bytes_per_s=round(nvlink_bps, 1) if has_nvlink else None,
            nvlink_rx_bytes_per_s=round(nvlink_bps, 1) if has_nvlink else None,
            recovery_action=recovery,
            pids=pids,
        )
