"""InfiniBand/RoCE port conditions from successive snapshots of a node's ports: the ``ib_port_health`` events
(:mod:`watchd.model.ib`). Pure: no I/O, no clock; the only time is the snapshots' own.

Each condition of each port is a small state machine, as the GPU conditions (:mod:`watchd.gpu.health`): an
event when it starts, again every ``report_interval_s`` while it holds (at once when what it reports
changes), one with ``value`` 0 when it clears. A field a scan could not read (None) judges nothing: the
condition stays as it was.

* ``port_down``: the port's logical state is not ACTIVE (or ACTIVE_DEFER) after the port was seen ACTIVE, or
  from the start for a port ``expected_ports`` names; a port whose device left the class folder (the HCA
  fell off the bus, the driver was unloaded) is down too (state ``missing``). A port never seen ACTIVE and
  not expected (the unused second port of a dual-port HCA, an SR-IOV function) is never reported.
* ``rate_downtrained``: an ACTIVE port's rate below its reference for ``downtrain_scans`` scans in a row
  (and back at it as long to clear). The reference: the rate ``expected_rates`` gives the port; else the
  fastest of the rate the port itself was seen ACTIVE at and (``compare_peers``) the rate of the fastest
  ACTIVE port of the same HCA type and link layer on the node (a GPU node's compute HCAs are identical:
  one at 400 Gb/s shows what the others should run at, even for a port already slow when the agent
  started). The link layer keeps a RoCE port (Ethernet) from being judged against an InfiniBand one on the
  same HCA model.
* ``link_errors``: per link counter of ``error_thresholds``, the sum of its rises over the last
  ``error_window_s``; it starts at the threshold and clears at or below a tenth of it. Only rises count. A
  counter below its base is believed reset (``perfquery -R``, a driver reload, a wrap) only when the next
  reading is below the base too: then the first low reading is the new base and only the rise above it
  counts. A single low reading followed by the old value (a glitch of one read) counts nothing: a reset
  and a climb back would otherwise report the counter's whole history as new errors. A counter at the top
  of its width (the PortCounters saturate and stop) counts what it rose to get there and nothing after
  (the event says ``saturated``). A counter's first reading is its base, and so is its first reading after
  its device came back: what happened before the agent watched is not reported.
"""

from __future__ import annotations

import fnmatch
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from watchd.ib.sysfs import PortReading, Snapshot
from watchd.model.events import Event, stable_id
from watchd.model.ib import (
    ACTIVE_STATES,
    COUNTER_WIDTHS,
    DEFAULT_ERROR_THRESHOLDS,
    KIND,
    LINK_ERRORS,
    PORT_DOWN,
    RATE_DOWNTRAINED,
    SOURCE,
    IbPortHealth,
)

__all__ = ["IbJudge", "IbParams", "PortView"]

_EPSILON_S = 1e-3
_RATE_EPSILON = 0.01
#: ports kept while gone (each reports port_down): beyond this, the longest gone are forgotten
MAX_TRACKED = 512
_MISSING = "missing"


@dataclass(frozen=True, slots=True)
class IbParams:
    report_interval_s: float = 60.0
    error_window_s: float = 300.0
    error_thresholds: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_ERROR_THRESHOLDS))
    downtrain_scans: int = 2
    expected_ports: tuple[str, ...] = ()  # fnmatch patterns over "device:port" (mlx5_*:1)
    expected_rates: Mapping[str, float] = field(default_factory=dict)  # pattern -> Gb/s
    compare_peers: bool = True

    def __post_init__(self) -> None:
        if self.report_interval_s <= 0 or self.error_window_s <= 0 or self.downtrain_scans < 1:
            raise ValueError("report_interval_s and error_window_s must be positive, downtrain_scans >= 1")
        if any(t < 1 for t in self.error_thresholds.values()):
            raise ValueError("error thresholds must be at least 1")


@dataclass(frozen=True, slots=True)
class _Reading:
    active: bool
    value: int | float
    evidence: str
    signature: object = None  # a change of it is reported at once
    threshold: int | float | None = None
    extra: Mapping[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class _Cond:
    active: bool = False
    last_report: float = 0.0
    signature: object = None


@dataclass(slots=True)
class _Counter:
    prev: int | None = None  # the base rises are counted from
    low: int | None = None  # a reading below the base, not yet believed: a reset only if the next one agrees
    increases: deque[tuple[float, int]] = field(default_factory=deque)
    saturated: bool = False

    def update(self, value: int, now: float, window_s: float, width: int | None) -> int:
        prev, low = self.prev, self.low
        self.low = None
        if prev is None:
            self.prev = value  # the first reading: what happened before is not counted
        elif value >= prev:
            # a lower reading just before (a glitch of one read) is forgotten: only the rise over the old
            # base counts, never the whole value again
            if value > prev:
                self.increases.append((now, value - prev))
            self.prev = value
        elif low is None:
            self.low = value  # below the base once: not a reset yet, nothing counted
        else:
            # below the base twice in a row: cleared (perfquery -R, a driver reload) or wrapped. The first
            # low reading is the new base; only what the counter rose above it since counts
            if value > low:
                self.increases.append((now, value - low))
            self.prev = value
        tops = (2**width - 1,) if width is not None else (2**32 - 1, 2**64 - 1)
        self.saturated = self.prev in tops
        horizon = now - window_s
        while self.increases and self.increases[0][0] <= horizon:
            self.increases.popleft()
        return sum(n for _, n in self.increases)

    def forget_base(self) -> None:
        """The port came back (a driver reload resets its counters): its next reading is a new base."""
        self.prev = self.low = None


@dataclass(slots=True)
class PortView:
    """What the judge keeps about one port (also what the metrics show of it)."""

    device: str
    port: int
    seen_active: bool = False
    max_rate: float = 0.0  # the fastest rate it was seen ACTIVE at
    reference: float | None = None  # the rate it was last judged against
    gone_since: float | None = None  # its device left the class folder
    last: PortReading | None = None
    bad_scans: int = 0
    good_scans: int = 0
    conds: dict[str, _Cond] = field(default_factory=dict)
    counters: dict[str, _Counter] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.device}:{self.port}"

    def active(self) -> list[str]:
        """The conditions that hold (``link_errors:<counter>`` for a counter's)."""
        return sorted(name for name, c in self.conds.items() if c.active)


def _group(r: PortReading) -> tuple[str, str | None]:
    return (r.hca_type or "", r.link_layer)


class IbJudge:
    """Turns one node's port snapshots into ``ib_port_health`` events (see the module docstring)."""

    def __init__(self, node: str, params: IbParams | None = None, source: str = SOURCE) -> None:
        self.node = node
        self.params = params or IbParams()
        self.source = source
        self.ports: dict[str, PortView] = {}
        self._last_time: float | None = None

    def _expected(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, p) for p in self.params.expected_ports)

    def observe(self, snap: Snapshot) -> list[Event]:
        """The events this snapshot starts, repeats or clears: ports by name, conditions in table order."""
        now = snap.time
        if self._last_time is not None:
            if now == self._last_time:
                return []
            if now < self._last_time:  # the clock was stepped back: restart the windows and schedules
                for v in self.ports.values():
                    for counter in v.counters.values():
                        counter.increases.clear()
                    for cond in v.conds.values():
                        cond.last_report = now
        self._last_time = now
        readings = {r.key: r for r in snap.ports}
        peers: dict[tuple[str, str | None], tuple[float, str]] = {}
        for one in readings.values():
            if one.state in ACTIVE_STATES and one.rate is not None:
                best = peers.get(_group(one))
                if best is None or one.rate.gbps > best[0]:
                    peers[_group(one)] = (one.rate.gbps, one.key)
        events: list[Event] = []
        for key in sorted(readings.keys() | self.ports.keys()):
            r = readings.get(key)
            view = self.ports.get(key)
            if view is None:
                assert r is not None
                view = self.ports[key] = PortView(r.device, r.port)
            if r is None:
                if not (view.seen_active or self._expected(key)):
                    del self.ports[key]  # gone before it was ever up: nothing to say
                    continue
                if view.gone_since is None:
                    view.gone_since = now
                events += self._gone(view, now)
            else:
                if view.gone_since is not None:
                    for counter in view.counters.values():
                        counter.forget_base()
                view.gone_since = None
                events += self._port(view, r, now, peers)
                view.last = r
        self._bound()
        return events

    def _bound(self) -> None:
        gone = sorted((v.gone_since, k) for k, v in self.ports.items() if v.gone_since is not None)
        for _, key in gone[: max(0, len(self.ports) - MAX_TRACKED)]:
            del self.ports[key]

    # --- one port ----------------------------------------------------------------------------------

    def _gone(self, view: PortView, now: float) -> list[Event]:
        was = f"was ACTIVE at {view.max_rate:g} Gb/sec" if view.seen_active and view.max_rate else "expected"
        evidence = f"{view.device} is gone from /sys/class/infiniband ({was})"
        reading = _Reading(True, 1, evidence, signature=_MISSING)
        event = self._step(view, PORT_DOWN, reading, now, state=_MISSING, phys=_MISSING)
        return [event] if event is not None else []

    def _port(
        self,
        view: PortView,
        r: PortReading,
        now: float,
        peers: Mapping[tuple[str, str | None], tuple[float, str]],
    ) -> list[Event]:
        out: list[Event] = []
        for name, reading in (
            (PORT_DOWN, self._down(view, r)),
            (RATE_DOWNTRAINED, self._downtrain(view, r, peers)),
        ):
            if reading is not None:
                event = self._step(view, name, reading, now, r=r)
                if event is not None:
                    out.append(event)
        for counter, threshold in self.params.error_thresholds.items():
            reading = self._errors(view, r, counter, threshold, now)
            if reading is not None:
                event = self._step(view, f"{LINK_ERRORS}:{counter}", reading, now, r=r)
                if event is not None:
                    out.append(event)
        return out

    def _down(self, view: PortView, r: PortReading) -> _Reading | None:
        if r.state is None:
            return None
        up = r.state in ACTIVE_STATES
        if up:
            view.seen_active = True
            cond = view.conds.get(PORT_DOWN)
            if cond is None or not cond.active:
                return None  # up, and nothing to clear
            rate = f", {r.rate.gbps:g} Gb/sec" if r.rate is not None else ""
            return _Reading(False, 0, f"{r.key} ACTIVE ({r.phys_name or '?'}{rate})")
        if not (view.seen_active or self._expected(r.key)):
            return None  # never up, not expected: an unused port
        was = (
            f"was ACTIVE at {view.max_rate:g} Gb/sec"
            if view.seen_active and view.max_rate
            else "was ACTIVE"
            if view.seen_active
            else "expected ACTIVE"
        )
        evidence = f"{r.key} {r.state_name} (physical {r.phys_name or '?'}), {was}"
        return _Reading(True, 1, evidence, signature=(r.state, r.phys_state))

    def _downtrain(
        self, view: PortView, r: PortReading, peers: Mapping[tuple[str, str | None], tuple[float, str]]
    ) -> _Reading | None:
        if r.state not in ACTIVE_STATES or r.rate is None:
            return None  # only a working link's rate means anything (a down port reads as SDR)
        rate = r.rate.gbps
        p = self.params
        configured = next((v for pat, v in p.expected_rates.items() if fnmatch.fnmatchcase(r.key, pat)), None)
        view.max_rate = max(view.max_rate, rate)
        if configured is not None:
            ref, reference, why = float(configured), "expected", "the configured rate"
        else:
            ref, reference, why = view.max_rate, "port_max", "the rate this port ran at"
            peer = peers.get(_group(r)) if p.compare_peers else None
            if peer is not None and peer[0] > ref + _RATE_EPSILON:
                ref, reference, why = peer[0], "peers", f"the rate of {peer[1]}"
        view.reference = ref
        cond = view.conds.get(RATE_DOWNTRAINED)
        active = cond is not None and cond.active
        slow = rate < ref - _RATE_EPSILON
        if slow:
            view.bad_scans, view.good_scans = view.bad_scans + 1, 0
        else:
            view.good_scans, view.bad_scans = view.good_scans + 1, 0
        n = p.downtrain_scans
        holds = view.good_scans < n if active else view.bad_scans >= n
        if not holds and not active:
            return None  # the usual case, decided before any text is built
        speed = f" ({r.rate.width}X {r.rate.speed})" if r.rate.width and r.rate.speed else ""
        signature: object = rate
        value = rate
        if slow:
            evidence = f"{r.key} at {rate:g} Gb/sec{speed}, below {ref:g} Gb/sec ({why})"
        else:
            evidence = f"{r.key} at {rate:g} Gb/sec{speed}" + (", recovering" if active else "")
            # recovering: nothing new to say; a re-report says the slow rate it holds for
            signature = cond.signature if cond is not None else None
            if isinstance(signature, float):
                value = signature
        return _Reading(
            holds, value, evidence, signature=signature, threshold=ref, extra={"reference": reference}
        )

    def _errors(
        self, view: PortView, r: PortReading, counter: str, threshold: int, now: float
    ) -> _Reading | None:
        value = r.counters.get(counter)
        if value is None:
            value = r.hw_counters.get(counter)
        if value is None:
            return None
        state = view.counters.get(counter)
        if state is None:
            state = view.counters[counter] = _Counter()
        window = self.params.error_window_s
        rise = state.update(value, now, window, COUNTER_WIDTHS.get(counter))
        cond = view.conds.get(f"{LINK_ERRORS}:{counter}")
        held = cond is not None and cond.active
        if not held and rise < threshold:
            return None  # the usual case, decided before any text is built
        active = rise > threshold // 10 if held else rise >= threshold
        full = ", saturated: it no longer counts, clear it with perfquery -R" if state.saturated else ""
        evidence = f"{r.key} {counter} +{rise} in {window:g}s (count {value}{full})"
        extra = {"counter": counter, "count": value, "saturated": state.saturated}
        return _Reading(active, rise, evidence, signature=None, threshold=threshold, extra=extra)

    # --- the state machine and the event -------------------------------------------------------------

    def _step(
        self,
        view: PortView,
        name: str,
        reading: _Reading,
        now: float,
        r: PortReading | None = None,
        state: str | None = None,
        phys: str | None = None,
    ) -> Event | None:
        cond = view.conds.get(name)
        if cond is None:
            if not reading.active:
                return None
            cond = view.conds[name] = _Cond()
        if not cond.active:
            if not reading.active:
                return None
            cond.active = True
        elif not reading.active:
            cond.active = False
            cond.signature = None
            return self._event(view, name, reading, 0, now, r, state, phys)
        elif not (
            reading.signature != cond.signature
            or now - cond.last_report >= self.params.report_interval_s - _EPSILON_S
        ):
            return None
        cond.last_report = now
        cond.signature = reading.signature
        return self._event(view, name, reading, reading.value, now, r, state, phys)

    def _event(
        self,
        view: PortView,
        name: str,
        reading: _Reading,
        value: int | float,
        now: float,
        r: PortReading | None,
        state: str | None,
        phys: str | None,
    ) -> Event:
        last = r if r is not None else view.last
        condition = name.partition(":")[0]
        extra = reading.extra
        health = IbPortHealth(
            condition=condition,
            device=view.device,
            port=view.port,
            value=value,
            threshold=reading.threshold,
            evidence=reading.evidence,
            link_layer=last.link_layer if last is not None else None,
            state=state or (r.state_name if r is not None else None),
            phys_state=phys or (r.phys_name if r is not None else None),
            # a down port's rate means nothing (the kernel shows SDR)
            rate_gbps=r.rate.gbps
            if r is not None and r.rate is not None and r.state in ACTIVE_STATES
            else None,
            reference=extra.get("reference"),  # type: ignore[arg-type]
            counter=extra.get("counter"),  # type: ignore[arg-type]
            count=extra.get("count"),  # type: ignore[arg-type]
            saturated=extra.get("saturated"),  # type: ignore[arg-type]
            hca_type=last.hca_type if last is not None else None,
        )
        return health.to_event(
            id=stable_id(self.node, KIND, view.key, name, now), node=self.node, source=self.source, time=now
        )
