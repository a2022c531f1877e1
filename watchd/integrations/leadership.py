"""Leadership: whether this engine may act now. The action pipeline asks it before every side effect
(scheduler calls, alerts, webhooks); reads (node states, pools, jobs) never wait for it.

Two elections implement it besides the lone engine's :class:`AlwaysLeader`: the Kubernetes Lease
(:mod:`watchd.integrations.kubernetes.lease`) and, for engines sharing a PostgreSQL store, the database lease
(:mod:`watchd.integrations.dblease`), whose fencing token every write and every side effect checks
(:meth:`Leadership.confirm`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

from watchd.logs import get_logger

_log = get_logger("watchd.leader")


class Leadership(Protocol):
    #: Who leads now, as far as this engine knows (None: unknown); named in "not the leader" outcomes.
    holder: str | None
    #: How long a side effect waits for leadership before it fails with "not the leader".
    takeover_wait_s: float

    async def wait_leader(self, timeout: float) -> bool:
        """True once this engine leads (at once when it does), False when ``timeout`` passed first."""
        ...

    async def confirm(self) -> bool:
        """Right before a side effect: whether this engine still leads *now*, asked of the authority (the
        database lease: this engine's fencing token is still the lease's, and the lease is not about to
        expire), not of what it believed at its last renewal. Never waits for leadership."""
        ...


class AlwaysLeader:
    """A lone engine: it always leads."""

    holder: str | None = None
    takeover_wait_s = 0.0

    async def wait_leader(self, timeout: float) -> bool:
        return True

    async def confirm(self) -> bool:
        return True


class ElectionLoop:
    """The rounds both elections share: every ``retry_period_s`` one :meth:`try_acquire_or_renew`; a leader
    that could not renew for ``renew_deadline_s``, or sees another holder, steps down. Subclasses give the
    round itself, the release on a clean stop and what they close then."""

    def __init__(
        self,
        *,
        identity: str,
        lease_duration_s: float,
        renew_deadline_s: float,
        retry_period_s: float,
        takeover_wait_s: float,
        on_change: Callable[[bool], None] | None,
        monotonic: Callable[[], float],
    ) -> None:
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.takeover_wait_s = takeover_wait_s
        self.on_change = on_change
        self._monotonic = monotonic
        self.is_leader = False
        self.holder: str | None = None
        self.last_error = ""
        self._renewed_at = 0.0
        self._leading = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -------------------------------------------------------------------------------------- for subclasses
    async def try_acquire_or_renew(self) -> bool:
        """One round: True when this engine holds the lease afterwards."""
        raise NotImplementedError

    async def _release(self) -> None:
        """On a clean stop, as leader: hand the lease back so the next engine takes over at once."""
        raise NotImplementedError

    async def _close(self) -> None:
        """After the release: close what the election owns (a connection, a client)."""

    def _stepped_down(self) -> None:
        """Called first whenever this engine is found not to lead (before :attr:`is_leader` changes)."""

    def _lease_label(self) -> str:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="leader-election")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.is_leader:
            await self._release()
            self._set(False)
        await self._close()

    async def wait_leader(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._leading.wait(), timeout)
        return self.is_leader

    async def _run(self) -> None:
        while True:
            ok = await self.try_acquire_or_renew()
            now = self._monotonic()
            if ok:
                self._renewed_at = now
                self._set(True)
            elif self.is_leader and (
                now - self._renewed_at >= self.renew_deadline_s or self.holder not in (None, self.identity)
            ):
                _log.warning(
                    "leadership_lost", identity=self.identity, holder=self.holder, error=self.last_error
                )
                self._set(False)
            await asyncio.sleep(self.retry_period_s)

    def _set(self, leading: bool) -> None:
        if not leading:
            self._stepped_down()
        if leading == self.is_leader:
            return
        self.is_leader = leading
        if leading:
            self._leading.set()
            _log.info(
                "leader_elected", identity=self.identity, lease=self._lease_label(), **self._elected_fields()
            )
        else:
            self._leading.clear()
        if self.on_change is not None:
            self.on_change(leading)

    def _elected_fields(self) -> dict[str, object]:
        return {}
