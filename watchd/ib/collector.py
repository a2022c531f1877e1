"""The agent's InfiniBand/RoCE port collector: every ``interval_s``, read the ports in a worker thread
(:class:`~watchd.ib.reader.SysfsReader`), judge them (:class:`~watchd.ib.judge.IbJudge`), keep the metrics
current and yield the ``ib_port_health`` events (an event source, as the Flight Recorder reader: the agent
ships what it yields).

A node without ``/sys/class/infiniband`` (no RDMA driver loaded, no HCA) scans to nothing: the collector
says so once (``ib_absent``), and again if the folder appears later (``ib_present``); it never fails for it.
A file that cannot be read is counted every time and logged once per file and reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from watchd.clock import Clock, SystemClock
from watchd.ib.judge import IbJudge, IbParams
from watchd.ib.metrics import IbPortCollector
from watchd.ib.reader import SysfsReader
from watchd.ib.settings import IbConfig
from watchd.ib.sysfs import Snapshot
from watchd.logs import get_logger
from watchd.model.events import Event
from watchd.model.ib import COUNTER_WIDTHS

__all__ = ["IbPortSource"]

_log = get_logger("watchd.source.ib")
_MAX_LOGGED = 256  # distinct (file, reason) pairs logged; the count goes on


def params_of(config: IbConfig) -> IbParams:
    return IbParams(
        report_interval_s=config.report_interval_s,
        error_window_s=config.error_window_s,
        error_thresholds=dict(config.error_thresholds),
        downtrain_scans=config.downtrain_scans,
        expected_ports=tuple(config.expected_ports),
        expected_rates=dict(config.expected_rate_gbps),
        compare_peers=config.compare_peers,
    )


class IbPortSource:
    name = "ib-ports"

    def __init__(
        self,
        node: str,
        config: IbConfig,
        *,
        clock: Clock | None = None,
        collector: IbPortCollector | None = None,
        on_scan: Callable[[str, float], None] | None = None,
        on_unreadable: Callable[[], None] | None = None,
    ) -> None:
        """``on_scan(outcome, seconds)``: each scan (``ok``, ``absent``) and the CPU seconds it took;
        ``on_unreadable()``: each file that could not be read."""
        self.config = config
        self._clock = clock or SystemClock()
        self.collector = collector
        self._on_scan = on_scan or (lambda outcome, seconds: None)
        self._on_unreadable = on_unreadable or (lambda: None)
        # a threshold on a counter outside the PortCounters table: looked for in both folders
        extra = tuple(c for c in config.error_thresholds if c not in COUNTER_WIDTHS)
        self.reader = SysfsReader(
            config.root,
            counters=(*COUNTER_WIDTHS, *extra),
            hw_counters=config.hw_counters_read(),
            devices=config.devices,
            max_devices=config.max_devices,
            max_ports=config.max_ports,
            on_unreadable=self._unreadable,
        )
        self.judge = IbJudge(node, params_of(config))
        self._absent: bool | None = None  # what was last said about the folder
        self._logged: set[tuple[str, str]] = set()
        self._said_skipped = False
        self.scans = 0

    def _unreadable(self, path: str, reason: str) -> None:
        self._on_unreadable()
        if (path, reason) not in self._logged and len(self._logged) < _MAX_LOGGED:
            self._logged.add((path, reason))
            _log.warning("ib_file_unreadable", path=path, reason=reason)

    def scan(self) -> Snapshot:
        """One read of the ports (blocking: in a worker thread)."""
        started = time.thread_time()
        snap = self.reader.scan(self._clock.now())
        self._on_scan("ok" if snap.present else "absent", time.thread_time() - started)
        return snap

    def observe(self, snap: Snapshot) -> list[Event]:
        """The events of one snapshot; the metrics follow it."""
        self.scans += 1
        if not snap.present and self._absent is not True:
            _log.info(
                "ib_absent", root=str(self.config.root), hint="no InfiniBand/RoCE device: nothing to watch"
            )
        elif snap.present and self._absent is True:
            _log.info("ib_present", root=str(self.config.root), ports=len(snap.ports))
        self._absent = not snap.present
        if snap.skipped and not self._said_skipped:
            self._said_skipped = True
            _log.warning(
                "ib_ports_skipped",
                skipped=snap.skipped,
                max_devices=self.config.max_devices,
                max_ports=self.config.max_ports,
            )
        events = self.judge.observe(snap)
        if self.collector is not None:
            self.collector.update(self.judge.ports.values())
        return events

    async def events(self) -> AsyncIterator[Event]:
        interval = self.config.interval_s
        while True:
            started = self._clock.monotonic()
            snap = await asyncio.to_thread(self.scan)
            for event in self.observe(snap):
                yield event
            await asyncio.sleep(max(0.0, interval - (self._clock.monotonic() - started)))
