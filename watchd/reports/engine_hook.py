"""The usage report's part of the engine, one subsystem (:mod:`watchd.subsystem`): it subscribes the ledger
to the GPU summaries and heartbeats (none with ``reports.observe`` off; the ledger keeps energy and idle time
per job GPU, and checkpoints); a periodic job writes it to the state database; another, when
``reports.metrics`` is on, builds the report by account and partition in a worker thread (``sacct``,
``sshare``, ``squeue`` and a read of the state) and serves it as ``watchd_usage_*``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry

from watchd.clock import Clock
from watchd.integrations.slurm.settings import SlurmConfig
from watchd.reports.core import build_report
from watchd.reports.ledger import UsageLedger
from watchd.reports.metrics import UsageCollector
from watchd.reports.model import Observed, UsageReport
from watchd.reports.settings import ReportsConfig
from watchd.reports.source import AccountingSource, build_source
from watchd.store.connection import StoreError
from watchd.store.database import Store
from watchd.subsystem import Component, Handler, Job

_log = structlog.get_logger("watchd.reports")
FLUSH_S = 30.0
FLUSH_PAGE = 2000  # rows a transaction: ~15 ms on SQLite, ~60 ms on PostgreSQL (loopback)


class UsageHook(Component):
    name = "usage"

    def __init__(
        self,
        config: ReportsConfig,
        registry: CollectorRegistry,
        clock: Clock,
        source: AccountingSource | None = None,
        *,
        slurm: SlurmConfig | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.slurm = slurm or SlurmConfig()  # its slurm_conf and squeue are the accounting commands' too
        self._accounting_why: str | None = None  # why the last refresh had no accounting ("": it had)
        self.ledger = UsageLedger(config.idle_util_pct)
        self.collector = UsageCollector(config.max_accounts)
        self.source = source
        self._store: Store | None = None
        self._state_path: Path | None = None
        if config.metrics:
            registry.register(self.collector)

    def subscriptions(self) -> Mapping[str, Handler]:
        return self.ledger.subscriptions() if self.config.observe else {}

    def attach(self, store: Store, state_path: Path | None) -> None:
        self._store = store
        self._state_path = state_path

    def jobs(self) -> Sequence[Job]:
        jobs = [Job("usage-flush", FLUSH_S, self.flush), Job("usage-prune", 3600.0, self.prune)]
        if self.config.metrics:
            jobs.append(Job("usage-metrics", self.config.metrics_interval_s, self.refresh_metrics))
        return jobs

    async def stop(self) -> None:
        await self.flush()

    async def flush(self) -> None:
        """Write what the ledger holds to the state database, :data:`FLUSH_PAGE` rows a transaction with the
        event loop served between them (one row per job GPU: at 100,000 GPUs 90,000 rows took 0.7 s at once
        on SQLite and 2.9 s on PostgreSQL, the loop held; docs/scale.md). A failed page keeps nothing of it:
        counted by the store's own error metric; the next windows are recorded again."""
        if self._store is None:
            return
        gpus, cps = self.ledger.take()
        rows = [(d.job, d.node, d.gpu, d.day, d.energy_j, d.gpu_s, d.idle_s, d.first, d.last) for d in gpus]
        for start in range(0, max(1, len(rows)), FLUSH_PAGE):
            if start:
                await asyncio.sleep(0.001)  # a timer: what became ready meanwhile runs first
            page = rows[start : start + FLUSH_PAGE]
            try:
                self._store.usage.add(page, cps if not start else [])
            except StoreError as exc:
                _log.warning("usage_not_recorded", error=str(exc), windows=len(page))

    async def prune(self) -> None:
        if self._store is not None:
            self._store.usage.prune(self.clock.now() - self.config.retention_days * 86400)

    async def refresh_metrics(self) -> None:
        now = self.clock.now()
        start = now - self.config.window
        try:
            report = await asyncio.to_thread(self._build, start, now)
        except Exception as exc:  # a broken accounting answer costs this refresh only
            _log.warning("usage_report_failed", error=str(exc))
            return
        self.collector.update(report)
        why = "" if report.accounting else report.accounting_note
        if why != self._accounting_why:  # once per change, not every refresh
            if why:
                _log.warning("usage_accounting_unavailable", why=why, source=self.config.source)
            elif self._accounting_why is not None:
                _log.info("usage_accounting_available", source=self.config.source)
            self._accounting_why = why

    def _build(self, start: float, now: float) -> UsageReport:
        cfg = self.config
        source = self.source or build_source(
            cfg.source, timeout_s=cfg.timeout_s, slurm_conf=self.slurm.slurm_conf, squeue=self.slurm.squeue
        )
        observed = Observed()
        if self._state_path is not None:
            from watchd.reports.observed import load_observed

            store = Store.open(self._state_path)  # its own connection: this runs in a worker thread
            try:
                observed = load_observed(store, start, now)
            finally:
                store.close()
        by = ("account", "partition", "user") if self.config.per_user else ("account", "partition")
        return build_report(
            source.fetch(start, now),
            observed,
            start=start,
            end=now,
            now=now,
            by=by,
            idle_util_pct=self.config.idle_util_pct,
        )
