"""The agent's per-port InfiniBand/RoCE metrics (``watchd_ib_port_*``), built at scrape time from the last
scan: a port that disappears from the node disappears from the output (but for a port that was up: it
stays, ``present`` 0, while the judge reports it down)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from watchd.ib.judge import PortView
from watchd.model.ib import ACTIVE_STATES

__all__ = ["IbPortCollector"]

_LABELS = ["device", "port"]


@dataclass(frozen=True, slots=True)
class _Row:
    device: str
    port: str
    present: bool
    state: int | None
    phys_state: int | None
    rate: float | None
    reference: float | None
    link_layer: str
    hca_type: str
    counters: tuple[tuple[str, int, bool], ...]  # name, value, saturated
    conditions: tuple[str, ...]


class IbPortCollector(Collector):
    def __init__(self) -> None:
        self._rows: tuple[_Row, ...] = ()

    def update(self, views: Iterable[PortView]) -> None:
        """The ports as the judge sees them after a scan (copied: a scrape never sees a scan half done)."""
        rows = []
        for v in views:
            r = v.last
            present = v.gone_since is None and r is not None
            counters: tuple[tuple[str, int, bool], ...] = ()
            if r is not None and present:
                saturated = {name for name, c in v.counters.items() if c.saturated}
                counters = tuple(
                    (name, value, name in saturated)
                    for name, value in sorted({**r.counters, **r.hw_counters}.items())
                )
            rows.append(
                _Row(
                    v.device,
                    str(v.port),
                    present,
                    r.state if r is not None and present else None,
                    r.phys_state if r is not None and present else None,
                    r.rate.gbps if r is not None and present and r.rate is not None else None,
                    v.reference,
                    (r.link_layer if r is not None else None) or "",
                    (r.hca_type if r is not None else None) or "",
                    counters,
                    tuple(v.active()),
                )
            )
        self._rows = tuple(rows)

    def collect(self) -> Iterator[Metric]:
        rows = self._rows
        info = GaugeMetricFamily(
            "watchd_ib_port_info",
            "An InfiniBand/RoCE port the agent reads (1).",
            labels=[*_LABELS, "link_layer", "hca_type"],
        )
        present = GaugeMetricFamily(
            "watchd_ib_port_present", "1 while the port is in sysfs, 0 once gone.", labels=_LABELS
        )
        up = GaugeMetricFamily("watchd_ib_port_up", "1 while the port's state is ACTIVE.", labels=_LABELS)
        state = GaugeMetricFamily(
            "watchd_ib_port_state",
            "The port's logical state (4 ACTIVE, 1 DOWN, 2 INIT, 3 ARMED).",
            labels=_LABELS,
        )
        phys = GaugeMetricFamily(
            "watchd_ib_port_phys_state",
            "The port's physical state (5 LinkUp, 3 Disabled, 2 Polling).",
            labels=_LABELS,
        )
        rate = GaugeMetricFamily("watchd_ib_port_rate_gbps", "The port's rate, Gb/s.", labels=_LABELS)
        ref = GaugeMetricFamily(
            "watchd_ib_port_reference_rate_gbps",
            "The rate the port is judged against (configured, its own best, or its peers').",
            labels=_LABELS,
        )
        counter = CounterMetricFamily(
            "watchd_ib_port_errors",
            "The port's error counters read (counters/ and hw_counters/), as the kernel shows them.",
            labels=[*_LABELS, "counter"],
        )
        saturated = GaugeMetricFamily(
            "watchd_ib_port_errors_saturated",
            "1 when a counter stopped at the top of its width (it no longer counts).",
            labels=[*_LABELS, "counter"],
        )
        condition = GaugeMetricFamily(
            "watchd_ib_port_condition",
            "1 while a condition holds (port_down, rate_downtrained, link_errors:<counter>).",
            labels=[*_LABELS, "condition"],
        )
        for r in rows:
            labels = [r.device, r.port]
            info.add_metric([*labels, r.link_layer, r.hca_type], 1)
            present.add_metric(labels, 1 if r.present else 0)
            up.add_metric(labels, 1 if r.state in ACTIVE_STATES else 0)
            if r.state is not None:
                state.add_metric(labels, r.state)
            if r.phys_state is not None:
                phys.add_metric(labels, r.phys_state)
            if r.rate is not None:
                rate.add_metric(labels, r.rate)
            if r.reference is not None:
                ref.add_metric(labels, r.reference)
            for name, value, full in r.counters:
                counter.add_metric([*labels, name], value)
                saturated.add_metric([*labels, name], 1 if full else 0)
            for cond in r.conditions:
                condition.add_metric([*labels, cond], 1)
        yield from (info, present, up, state, phys, rate, ref, counter, saturated, condition)
