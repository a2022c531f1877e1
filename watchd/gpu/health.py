"""GPU health conditions derived from successive samples: the ``gpu_health`` events of docs/rules.md.

One :class:`HealthDeriver` per node, fed every sample of every GPU of that node in time order per GPU (GPUs
may interleave). Pure: no I/O, no clock; the only time is the samples' own.

Each condition of each GPU is a small state machine: an event when it starts, the same event again every
``report_interval_s`` while it holds (sooner when a discrete value changes: more ECC errors, another link
down, another recovery action), and one event with ``value: 0`` when it clears. A field that is ``None``
(unsupported, or the GPU is lost) leaves its conditions as they are and produces no event.

Noise handling, per condition:

* counters (volatile uncorrectable ECC, PCIe replays, NVLink errors) only count increases; a counter that
  goes down was reset (driver reload, GPU reset) and is re-baselined, never a negative delta or a burst.
  The volatile ECC count at a GPU's first sample is the baseline: errors counted before watchd started are
  not reported; after a reset the baseline is 0 (volatile counters restart at 0).
* bursts (``pcie_replay_burst``, ``nvlink_errors``) sum the increases over the last ``report_interval_s``;
  a burst starts above its threshold and ends at or below a lower clear threshold.
* ``pcie_downtrain``: a link width below its maximum always counts; a generation below its maximum counts
  only while the GPU is busy (``util_gpu`` at or above ``pcie_gen_busy_util``), because idle GPUs drop the
  link to a low generation to save power (a lower P-state, ASPM), which is normal. A streak of
  ``downtrain_samples`` judged samples is needed to start and to clear it; idle samples judge nothing
  about the generation.
* clock-event reasons (``hw_slowdown``, ``thermal_slowdown``, ``power_brake``): the fraction of the samples
  of the last ``slowdown_window_s`` with the bit set; it starts above ``slowdown_fire`` and clears below
  ``slowdown_clear``, judged only once the window holds ``slowdown_min_samples`` samples.
* ``nccl_spin`` (the NCCL hang signature, DESIGN.md, between two windows): utilization at or above
  ``spin_util`` while power is at most ``spin_power_ratio`` of the GPU's own computing baseline and NVLink +
  PCIe traffic at most ``spin_link_ratio`` of its baseline, for ``spin_samples`` samples in a row; it clears
  at the first sample that is not. The baselines are running averages of computing samples (utilization >=
  50%, power not collapsed), as the engine keeps them per window; judged once ``spin_baseline_samples``
  computing samples were seen. ``since`` is the first spinning sample: the hang detector counts from it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from watchd.gpu.model import GpuSample
from watchd.model.conditions import BY_NAME, GpuCondition
from watchd.model.conditions import CONDITIONS as CONDITION_NAMES
from watchd.model.events import Event, stable_id
from watchd.model.gpu import HEALTH_KIND as KIND
from watchd.model.gpu import GpuHealth
from watchd.xid.catalog import RECOVERY_ACTIONS

#: The conditions, in the order their events are returned for one sample (rows of the model's table).
CONDITIONS = CONDITION_NAMES

#: the text of a lost GPU's event, by backend: what said so
LOST_TEXT = {
    "nvml": "NVML: GPU is lost",
    "fake": "NVML: GPU is lost",
    "dcgm": "dcgm-exporter: GPU gone from its page",
}
_EPSILON_S = 1e-3  # float noise in sample times must not postpone a re-report by a whole sampling period


def recovery_action_name(code: int) -> str:
    return RECOVERY_ACTIONS.get(code, f"UNKNOWN_{code}")


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """Limits of the derived conditions. Bursts are counted over the deriver's report interval."""

    pcie_replay_burst: int = 100  # PCIe replays per interval above which a burst starts
    pcie_replay_clear: int = 10  # ... and at or below which it ends
    nvlink_error_burst: int = 10  # NVLink CRC/replay/recovery errors per interval above which a burst starts
    nvlink_error_clear: int = 0  # ... and at or below which it ends
    slowdown_window_s: float = 30.0  # sliding window of the clock-event reason fractions
    slowdown_fire: float = 0.5  # fraction of the window's samples with the bit set above which it starts
    slowdown_clear: float = 0.2  # ... and below which it clears
    slowdown_min_samples: int = 3  # samples the window needs before it is judged either way
    pcie_gen_busy_util: float = 50.0  # GPU utilization (%) from which a PCIe generation below max counts
    downtrain_samples: int = 3  # consecutive judged samples needed to start or to clear pcie_downtrain
    spin_util: float = 90.0  # nccl_spin: utilization (%) at or above which ...
    spin_power_ratio: float = 0.6  # ... power at most this share of the computing baseline ...
    spin_link_ratio: float = 0.1  # ... and NVLink + PCIe traffic at most this share of its baseline
    spin_samples: int = 2  # consecutive spinning samples that start it
    spin_baseline_samples: int = 10  # computing samples seen before it is judged

    def __post_init__(self) -> None:
        if not 0 <= self.pcie_replay_clear <= self.pcie_replay_burst:
            raise ValueError("need 0 <= pcie_replay_clear <= pcie_replay_burst")
        if not 0 <= self.nvlink_error_clear <= self.nvlink_error_burst:
            raise ValueError("need 0 <= nvlink_error_clear <= nvlink_error_burst")
        if not 0 < self.slowdown_clear <= self.slowdown_fire < 1:
            raise ValueError("need 0 < slowdown_clear <= slowdown_fire < 1")
        if self.slowdown_window_s <= 0 or self.slowdown_min_samples < 1 or self.downtrain_samples < 1:
            raise ValueError("slowdown_window_s must be positive, sample counts at least 1")
        if self.spin_samples < 1 or not 0 < self.spin_power_ratio <= 1 or not 0 < self.spin_link_ratio <= 1:
            raise ValueError("spin_samples at least 1, spin ratios in (0, 1]")


@dataclass(frozen=True, slots=True)
class _Reading:
    """What one sample says about one condition."""

    active: bool
    value: int | float  # reported while active; a clear reports 0
    evidence: str
    threshold: int | float | None = None
    report_change: bool = False  # a changed value is reported at once, not at the next interval
    since: float | None = None  # nccl_spin: its first spinning sample


@dataclass(slots=True)
class _CondState:
    active: bool = False
    last_report: float = 0.0
    value: int | float = 0


@dataclass(slots=True)
class _Counter:
    """A cumulative counter turned into a sliding-window sum of its increases."""

    prev: int | None = None
    increases: deque[tuple[float, int]] = field(default_factory=deque)

    def update(self, value: int, now: float, window_s: float) -> int:
        if self.prev is not None and value > self.prev:
            self.increases.append((now, value - self.prev))
        self.prev = value  # a value below the previous one is a reset: re-baseline, count nothing
        horizon = now - window_s
        while self.increases and self.increases[0][0] <= horizon:
            self.increases.popleft()
        return sum(n for _, n in self.increases)


@dataclass(slots=True)
class _GpuState:
    last_time: float | None = None
    conds: dict[str, _CondState] = field(default_factory=lambda: {c: _CondState() for c in CONDITIONS})
    ecc_base: int | None = None
    ecc_prev: int | None = None
    replays: _Counter = field(default_factory=_Counter)
    nvlink_errors: _Counter = field(default_factory=_Counter)
    links_seen_up: set[int] = field(default_factory=set)
    clock: deque[tuple[float, int]] = field(default_factory=deque)
    downtrain_bad: int = 0
    downtrain_good: int = 0
    downtrain_by_gen: bool = False
    power_base: float | None = None  # nccl_spin: running average of computing samples
    link_base: float | None = None
    computed: int = 0  # computing samples seen
    spin_run: int = 0  # spinning samples in a row
    spin_since: float = 0.0  # the first of them

    def restart_time(self, now: float) -> None:
        """Sample time went backwards (the clock was stepped): restart the windows and report schedules."""
        self.replays.increases.clear()
        self.nvlink_errors.increases.clear()
        self.clock.clear()
        for cond in self.conds.values():
            cond.last_report = now


class HealthDeriver:
    """Turns one node's GPU samples into ``gpu_health`` events (see the module docstring)."""

    def __init__(
        self,
        source: str = "nvml",
        report_interval_s: float = 30.0,
        thresholds: HealthThresholds | None = None,
    ) -> None:
        if report_interval_s <= 0:
            raise ValueError("report_interval_s must be positive")
        self.source = source
        self.report_interval_s = report_interval_s
        self.thresholds = thresholds or HealthThresholds()
        self._gpus: dict[str, _GpuState] = {}

    def active(self, uuid: str) -> dict[str, int | float]:
        """The conditions that hold on a GPU now, with their last reported value."""
        state = self._gpus.get(uuid)
        if state is None:
            return {}
        return {name: c.value for name, c in state.conds.items() if c.active}

    def forget(self, uuid: str) -> None:
        """Drop a GPU's state (it left the node); its next sample starts from scratch."""
        self._gpus.pop(uuid, None)

    def observe(self, sample: GpuSample, node: str) -> list[Event]:
        """The events this sample starts, repeats or clears, in :data:`CONDITIONS` order."""
        state = self._gpus.setdefault(sample.gpu.uuid, _GpuState())
        now = sample.time
        if state.last_time is not None:
            if now == state.last_time:
                return []  # the same reading again
            if now < state.last_time:
                state.restart_time(now)
        state.last_time = now
        events: list[Event] = []
        for name in CONDITIONS:
            reading = self._read(name, state, sample)
            if reading is None:
                continue
            event = self._step(name, state.conds[name], reading, sample, node)
            if event is not None:
                events.append(event)
        return events

    def _step(
        self, name: str, cond: _CondState, reading: _Reading, sample: GpuSample, node: str
    ) -> Event | None:
        now = sample.time
        if not cond.active:
            if not reading.active:
                return None
            cond.active = True
        elif not reading.active:
            cond.active = False
            cond.value = 0
            return self._event(name, sample, node, 0, reading)
        elif not (
            (reading.report_change and reading.value != cond.value)
            or now - cond.last_report >= self.report_interval_s - _EPSILON_S
        ):
            return None
        cond.last_report = now
        cond.value = reading.value
        return self._event(name, sample, node, reading.value, reading)

    def _event(self, name: str, sample: GpuSample, node: str, value: int | float, r: _Reading) -> Event:
        gpu = sample.gpu
        health = GpuHealth(
            condition=name,
            gpu=gpu.index,
            uuid=gpu.uuid,
            pci_bus_id=gpu.pci_bus_id,
            value=value,
            threshold=r.threshold,
            evidence=r.evidence,
            extra={} if r.since is None else {"since": r.since},
        )
        return health.to_event(
            id=stable_id(node, KIND, gpu.uuid, name, sample.time),
            node=node,
            source=self.source,
            time=sample.time,
        )

    # --- one reading per condition -------------------------------------------------------------------

    def _read(self, name: str, st: _GpuState, s: GpuSample) -> _Reading | None:
        if name == "gpu_lost":
            if s.lost:
                return _Reading(True, 1, LOST_TEXT.get(self.source, f"{self.source}: GPU is lost"))
            return _Reading(False, 0, "GPU answers again")
        if s.lost:
            return None
        if name == "ecc_dbe":
            return self._ecc(st, s.ecc_volatile_uncorrected)
        cond = BY_NAME[name]
        if cond.flag is not None:
            return _flag(cond, s)
        if name == "recovery_action":
            if s.recovery_action is None:
                return None
            code = s.recovery_action
            return _Reading(code != 0, code, recovery_action_name(code), report_change=True)
        if name == "pcie_downtrain":
            return self._downtrain(st, s)
        if name == "pcie_replay_burst":
            if s.pcie_replay_count is None:
                return None
            n = st.replays.update(s.pcie_replay_count, s.time, self.report_interval_s)
            t = self.thresholds
            active = n > (t.pcie_replay_clear if st.conds[name].active else t.pcie_replay_burst)
            evidence = f"{n} PCIe replays in {self.report_interval_s:g}s (count {s.pcie_replay_count})"
            return _Reading(active, n, evidence, t.pcie_replay_burst)
        if name == "nvlink_down":
            return self._nvlink_down(st, s.nvlink_up)
        if name == "nvlink_errors":
            if s.nvlink_errors is None:
                return None
            n = st.nvlink_errors.update(s.nvlink_errors, s.time, self.report_interval_s)
            t = self.thresholds
            active = n > (t.nvlink_error_clear if st.conds[name].active else t.nvlink_error_burst)
            evidence = f"{n} NVLink errors (CRC, replay, recovery) in {self.report_interval_s:g}s"
            return _Reading(active, n, evidence, t.nvlink_error_burst)
        if cond.clock_reasons:
            return self._clock_reason(cond, st, s)
        if name == "nccl_spin":
            return self._spin(st, s)
        raise AssertionError(f"condition {name!r} has no derivation")  # a table row without a flag or bits

    def _ecc(self, st: _GpuState, count: int | None) -> _Reading | None:
        if count is None:
            return None
        if st.ecc_base is None:
            st.ecc_base = count
        elif st.ecc_prev is not None and count < st.ecc_prev:
            st.ecc_base = 0  # reset (driver reload, GPU reset): volatile counters restart at 0
        st.ecc_prev = count
        new = count - st.ecc_base
        if new > 0:
            evidence = f"volatile uncorrectable ECC count {count}, {new} new"
        else:
            evidence = f"volatile uncorrectable ECC count {count}, no new errors"
        return _Reading(new > 0, new, evidence, 0, report_change=True)

    def _downtrain(self, st: _GpuState, s: GpuSample) -> _Reading | None:
        t = self.thresholds
        cond = st.conds["pcie_downtrain"]
        width, width_max, gen, gen_max = (
            s.pcie_link_width,
            s.pcie_link_width_max,
            s.pcie_link_gen,
            s.pcie_link_gen_max,
        )
        link = f"PCIe Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"
        width_bad = width_ok = gen_bad = gen_ok = False
        if width is not None and width_max is not None and width > 0:
            width_bad, width_ok = width < width_max, width >= width_max
        busy = s.util_gpu is not None and s.util_gpu >= t.pcie_gen_busy_util
        if gen is not None and gen_max is not None and busy:
            gen_bad, gen_ok = gen < gen_max, gen >= gen_max
        value: int | float
        threshold: int | None
        if width_bad or gen_bad:
            st.downtrain_bad += 1
            st.downtrain_good = 0
            st.downtrain_by_gen = not width_bad
            if width_bad:
                assert width is not None and width_max is not None
                value, threshold = width, width_max
                evidence = f"{link}, expected x{width_max}" + (f" Gen{gen_max}" if gen_bad else "")
            else:
                assert gen is not None and gen_max is not None and s.util_gpu is not None
                value, threshold = gen, gen_max
                evidence = f"{link} at {s.util_gpu:.0f}% utilization, expected Gen{gen_max}"
        elif (width_ok or gen_ok) and (gen_ok or not st.downtrain_by_gen):
            # judged good; an idle sample says nothing about a generation that was what was wrong
            st.downtrain_good += 1
            st.downtrain_bad = 0
            value, threshold = cond.value, width_max if not st.downtrain_by_gen else gen_max
            evidence = f"{link}, recovering" if cond.active else link
        else:
            return None
        if cond.active:
            active = st.downtrain_good < t.downtrain_samples
        else:
            active = st.downtrain_bad >= t.downtrain_samples
        return _Reading(active, value, evidence, threshold, report_change=True)

    def _nvlink_down(self, st: _GpuState, up: tuple[bool, ...] | None) -> _Reading | None:
        if up is None:
            return None
        st.links_seen_up.update(i for i, is_up in enumerate(up) if is_up)
        down = sorted(i for i in st.links_seen_up if i >= len(up) or not up[i])
        n_up = sum(up)
        if down:
            names = ", ".join(str(i) for i in down)
            evidence = f"NVLink {names} down ({n_up} of {len(up)} up)"
        else:
            evidence = f"all NVLinks up ({n_up} of {len(up)})"
        return _Reading(bool(down), len(down), evidence, 0, report_change=True)

    def _clock_reason(self, cond: GpuCondition, st: _GpuState, s: GpuSample) -> _Reading | None:
        t = self.thresholds
        name = cond.name
        if name == _FIRST_CLOCK:  # the first clock condition: maintain the window once per sample
            if s.clock_event_reasons is None:
                return None
            st.clock.append((s.time, s.clock_event_reasons))
            horizon = s.time - t.slowdown_window_s
            while st.clock and st.clock[0][0] <= horizon:
                st.clock.popleft()
        elif s.clock_event_reasons is None:
            return None
        if len(st.clock) < t.slowdown_min_samples:
            return None
        bits = cond.clock_reasons
        mask = 0
        for bit, _ in bits:
            mask |= bit
        seen = 0
        hits = 0
        for _, reasons in st.clock:
            if reasons & mask:
                hits += 1
                seen |= reasons & mask
        fraction = hits / len(st.clock)
        active = st.conds[name].active
        active = fraction >= t.slowdown_clear if active else fraction > t.slowdown_fire
        names = "/".join(label for bit, label in bits if seen & bit) or "/".join(label for _, label in bits)
        evidence = (
            f"{names} {fraction:.0%} of {len(st.clock)} samples in {t.slowdown_window_s:g}s"
            f" (reasons 0x{s.clock_event_reasons:x})"
        )
        return _Reading(active, round(fraction, 3), evidence, t.slowdown_fire)

    def _spin(self, st: _GpuState, s: GpuSample) -> _Reading | None:
        util, power = s.util_gpu, s.power_w
        if util is None or power is None:
            return None
        t = self.thresholds
        links = (
            s.nvlink_tx_bytes_per_s,
            s.nvlink_rx_bytes_per_s,
            s.pcie_tx_bytes_per_s,
            s.pcie_rx_bytes_per_s,
        )
        known = [x for x in links if x is not None]
        link = sum(known) if known else None
        base, link_base = st.power_base, st.link_base
        if util >= 50.0 and (base is None or power >= t.spin_power_ratio * base):
            # a computing sample: the baselines learn from these only (a spin never pulls them down)
            st.power_base = power if base is None else base + _BASE_EWMA * (power - base)
            if link is not None:
                st.link_base = link if link_base is None else link_base + _BASE_EWMA * (link - link_base)
            st.computed += 1
        if base is None or st.computed < t.spin_baseline_samples:
            return None
        spinning = (
            util >= t.spin_util
            and power <= t.spin_power_ratio * base
            and (link is None or link_base is None or link <= t.spin_link_ratio * link_base)
        )
        if not spinning:
            st.spin_run = 0
            return _Reading(False, 0, "not spinning")
        if st.spin_run == 0:
            st.spin_since = s.time
        st.spin_run += 1
        ratio = round(power / base, 3)
        evidence = (
            f"util {util:.0f}%, power {power:.0f} W = {ratio:.0%} of its computing baseline {base:.0f} W"
        )
        if link is not None and link_base:
            evidence += f", links {link / link_base:.1%} of baseline"
        active = st.spin_run >= t.spin_samples or st.conds["nccl_spin"].active
        return _Reading(active, ratio, evidence, t.spin_power_ratio, since=st.spin_since)


_BASE_EWMA = 0.1  # per sample (every 1-2 s): about the engine's 0.2 per 5 s window


def _flag(cond: GpuCondition, s: GpuSample) -> _Reading | None:
    """A condition that holds while a boolean sample field is true (the table's ``flag``)."""
    assert cond.flag is not None
    flag: bool | None = getattr(s, cond.flag)
    if flag is None:
        return None
    if not flag:
        return _Reading(False, 0, cond.clear_evidence)
    evidence = cond.set_evidence
    if cond.detail is not None:
        detail = getattr(s, cond.detail[0])
        if detail is not None:
            evidence += cond.detail[1].format(detail)
    return _Reading(True, 1, evidence)


_FIRST_CLOCK = next(c.name for c in BY_NAME.values() if c.clock_reasons)


__all__ = [
    "CONDITIONS",
    "KIND",
    "RECOVERY_ACTIONS",
    "HealthDeriver",
    "HealthThresholds",
    "recovery_action_name",
]
