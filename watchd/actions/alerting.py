"""The alerts watchd keeps firing: a rule's alert until it expires, the breaker alert while its pool has
actions held, both recorded so that a restarted engine fires them again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from watchd.actions.leader_gate import LeaderGate
from watchd.clock import Clock
from watchd.integrations.alerts import Alert, AlertSink
from watchd.logs import get_logger
from watchd.store import keys
from watchd.store.connection import StoreError
from watchd.store.database import Store

_log = get_logger("watchd.executor")

BREAKER_ALERT = "WatchdBlastRadiusBreakerOpen"

Spawn = Callable[[Coroutine[Any, Any, None]], None]


class AlertKeeper:
    def __init__(
        self,
        sink: AlertSink | None,
        store: Store,
        clock: Clock,
        leader: LeaderGate,
        spawn: Spawn,
        breaker_window_s: Callable[[], float],
    ) -> None:
        self._sink = sink
        self._store = store
        self._clock = clock
        self._leader = leader
        self._spawn = spawn
        self._breaker_window_s = breaker_window_s
        self._expiry: dict[str, asyncio.TimerHandle] = {}

    @property
    def enabled(self) -> bool:
        return self._sink is not None

    def close(self) -> None:
        for handle in self._expiry.values():
            handle.cancel()

    async def fire(self, key: str, alert: Alert, resolve_after: float) -> None:
        """Fire (or refresh) ``key`` and record it, so that a restarted engine fires it again."""
        if self._sink is None:
            return
        await self._sink.fire(key, alert)
        record = {
            "labels": alert.labels,
            "annotations": alert.annotations,
            "generator_url": alert.generator_url,
        }
        try:
            self._store.alerts.set(key, record, self._clock.now() + resolve_after)
        except StoreError as exc:  # a traceback per alert helps nobody: the store's metrics count it
            _log.error("firing_alert_not_recorded", key=key, error=str(exc), rate_limited=True)
        pool = keys.breaker_pool(key)
        self._expire(key, resolve_after, None if pool is None else lambda: self.holding(pool))

    async def refire(self) -> None:
        """At start: the alerts firing when the engine stopped fire again with what was left of their time
        (and a breaker alert for as long as its pool has actions held); those whose time ran out meanwhile
        are forgotten (Alertmanager ends them itself when their endsAt passes)."""
        if self._sink is None:
            return
        now = self._clock.now()
        firing = self._store.alerts.list()
        if firing and (refusal := await self._leader.refusal("re-firing alerts")) is not None:
            _log.warning("alerts_not_refired", reason=refusal)
            return
        for key, record, resolve_at in firing:
            pool = keys.breaker_pool(key)
            if resolve_at <= now and not (pool is not None and self.holding(pool)):
                self._store.alerts.clear(key)
                continue
            try:
                alert = Alert(
                    record["labels"], record.get("annotations") or {}, record.get("generator_url", "")
                )
            except (KeyError, TypeError, ValueError) as exc:
                _log.warning("firing_alert_unreadable", key=key, error=str(exc))
                self._store.alerts.clear(key)
                continue
            await self.fire(key, alert, max(resolve_at - now, 1.0))

    def holding(self, pool: str) -> bool:
        return any(h.pool == pool for h in self._store.held.list())

    async def breaker_open(self, reason: str, kind: str, node: str, pool: str) -> None:
        """The pool's breaker held an action: page, for as long as anything of the pool is held (not only
        while the window is full)."""
        if self._sink is None:
            return
        if (refusal := await self._leader.refusal(f"alert {BREAKER_ALERT}")) is not None:
            _log.warning("breaker_alert_not_fired", reason=refusal)
            return
        alert = Alert(
            labels={"alertname": BREAKER_ALERT, "severity": "critical", "pool": pool},
            annotations={
                "summary": f"watchd is holding disruptive actions ({pool})",
                "description": f"{reason}. Held: {kind} of {node}. "
                "Review with `watchd actions list`, then release or discard.",
            },
        )
        await self.fire(keys.breaker_alert(pool), alert, self._breaker_window_s())

    def breaker_cleared(self, pool: str) -> None:
        """After a release or discard: the breaker alert of a pool with nothing held left resolves now."""
        key = keys.breaker_alert(pool)
        if key in self._expiry and not self.holding(pool):
            self._expire(key, 0.0)

    def _expire(self, key: str, after: float, holds: Callable[[], bool] | None = None) -> None:
        """Resolve ``key`` ``after`` seconds from now; while ``holds()`` says the condition is still there,
        look again every ``min(after, 60)`` seconds instead."""
        old = self._expiry.pop(key, None)
        if old is not None:
            old.cancel()
        if self._sink is None:
            return
        loop = asyncio.get_running_loop()

        def resolve() -> None:
            if holds is not None and holds():
                self._expiry[key] = loop.call_later(min(after, 60.0), resolve)
                return
            self._expiry.pop(key, None)
            with contextlib.suppress(StoreError):
                self._store.alerts.clear(key)
            self._spawn(self._resolve(key))

        self._expiry[key] = loop.call_later(after, resolve)

    async def _resolve(self, key: str) -> None:
        assert self._sink is not None
        if (refusal := await self._leader.refusal(f"resolve alert {key}")) is not None:
            _log.warning("alert_not_resolved", reason=refusal)
            return
        await self._sink.resolve(key)
