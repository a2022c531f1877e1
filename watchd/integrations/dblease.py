"""Leader election through a lease row in the shared PostgreSQL store, with a fencing token (HA on
bare metal, no Kubernetes needed).

The row ``leader_lease(name, holder, token, acquired_at, expires_at)`` (migration 4 of
:mod:`watchd.store.schema`) is the lease. Times are the database server's clock
(``clock_timestamp()``), the one clock both engines agree on: no skew between machines matters.

- Every ``retry_period`` each engine runs one conditional ``UPDATE``: the holder renews (its token unchanged,
  ``expires_at`` pushed ``lease_duration`` ahead); another takes the row only when it is free (released) or
  expired, and taking it **increments the token**. One statement, so of two engines racing for an expired
  lease exactly one wins (the row lock orders them; the second finds it no longer expired).
- The token fences every write: the store checks it inside each write transaction
  (:meth:`DatabaseLease.check`: ``SELECT holder, token ... FOR SHARE``). The row lock orders the check against
  a takeover: a takeover waits for a write in progress, and a write after it sees the new token, so a deposed
  leader that wakes up late (paused with SIGSTOP, partitioned) writes nothing.
- The token fences every side effect: the leader gate asks :meth:`DatabaseLease.confirm` right before each
  scheduler call, alert and webhook; it answers from the database (token current, lease not about to
  expire), not from what this engine believed at its last renewal.
- A leader that could not renew for ``renew_deadline`` steps down (its token dropped at once, so even its own
  writes stop) before its lease can expire elsewhere (``renew_deadline < lease_duration``).
- On a clean shutdown the leader releases the row (empty holder): the other takes over at its next round.

A session paused inside a write transaction holds the row's share lock until the server ends it
(``idle_in_transaction_session_timeout``, set by the store's driver); the takeover waits at most that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from watchd.extras import missing_extra

try:
    import psycopg
except ImportError as exc:  # the optional dependency: name the extra, not a traceback
    raise missing_extra("postgres", exc) from exc

from watchd.integrations.leadership import ElectionLoop
from watchd.logs import get_logger
from watchd.store.connection import Fenced, Tx

_log = get_logger("watchd.leader")

_NOW = "EXTRACT(EPOCH FROM clock_timestamp())::float8"

_ROUND = f"""
UPDATE leader_lease SET
    holder = %(me)s,
    token = CASE WHEN holder = %(me)s AND token = %(mine)s THEN token ELSE token + 1 END,
    acquired_at = CASE WHEN holder = %(me)s AND token = %(mine)s THEN acquired_at ELSE {_NOW} END,
    expires_at = {_NOW} + %(duration)s
WHERE name = %(name)s AND ((holder = %(me)s AND token = %(mine)s) OR holder = '' OR expires_at < {_NOW})
RETURNING token
"""
_CONFIRM = f"""
SELECT holder = %(me)s AND token = %(mine)s AND expires_at - {_NOW} > %(margin)s
FROM leader_lease WHERE name = %(name)s
"""

_HOLDER = "SELECT holder, token FROM leader_lease WHERE name = %(name)s"

Connect = Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]


def default_identity() -> str:
    """Unique per engine process: the host's name and the process id (two engines on one host differ too)."""
    return f"{socket.gethostname()}-{os.getpid()}"


class DatabaseLease(ElectionLoop):
    """An elected :class:`~watchd.integrations.leadership.Leadership` and the store's
    :class:`~watchd.store.connection.Fence`."""

    def __init__(
        self,
        connect: Connect,
        *,
        name: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        takeover_wait_s: float | None = None,
        on_change: Callable[[bool], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``takeover_wait_s``: how long a side effect waits for leadership (default: a lease duration and two
        retry periods, time for a crashed leader's lease to expire and be taken)."""
        super().__init__(
            identity=identity,
            lease_duration_s=lease_duration_s,
            renew_deadline_s=renew_deadline_s,
            retry_period_s=retry_period_s,
            takeover_wait_s=(
                takeover_wait_s if takeover_wait_s is not None else lease_duration_s + 2 * retry_period_s
            ),
            on_change=on_change,
            monotonic=monotonic,
        )
        self._connect = connect
        self.name = name
        #: a side effect needs this much of the lease left (a leader that has not renewed for its renew
        #: deadline no longer acts, whatever its own belief)
        self.margin_s = lease_duration_s - renew_deadline_s
        #: the fencing token this engine holds; None when it does not lead (every write is then refused)
        self.token: int | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()

    async def _close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    def _stepped_down(self) -> None:
        self.token = None  # at once: no write of this engine passes the fence from now on

    def _lease_label(self) -> str:
        return self.name

    def _elected_fields(self) -> dict[str, object]:
        return {"token": self.token}

    async def confirm(self) -> bool:
        """Whether this engine's token is still the lease's and the lease has more than ``margin_s`` left,
        by the database's clock; False when the database cannot say."""
        token = self.token
        if token is None or not self.is_leader:
            return False
        params = {"me": self.identity, "mine": token, "margin": self.margin_s, "name": self.name}
        try:
            row = await self._query(_CONFIRM, params)
        except (psycopg.Error, OSError) as exc:
            self.last_error = _first_line(exc)
            return False
        return bool(row and row[0])

    def check(self, tx: Tx) -> None:
        """The store's fence, inside each write transaction: this engine's token is still the lease's."""
        token = self.token
        row = tx.execute(
            "SELECT holder, token FROM leader_lease WHERE name = ? FOR SHARE", (self.name,)
        ).fetchone()
        if token is None:
            holder = row[0] if row is not None else None
            raise Fenced(f"not the leader (the lease is held by {holder or 'nobody'})")
        if row is None or row[0] != self.identity or int(row[1]) != token:
            current = "none" if row is None else f"{row[0] or 'nobody'} with token {row[1]}"
            raise Fenced(f"fencing token {token} is no longer current (the lease: {current})")

    # ------------------------------------------------------------------------------------------ rounds
    async def try_acquire_or_renew(self) -> bool:
        """One round: True when this engine holds the lease afterwards (:attr:`token` is then its token)."""
        params = {
            "me": self.identity,
            "mine": self.token if self.token is not None else -1,
            "duration": self.lease_duration_s,
            "name": self.name,
        }
        try:
            row = await self._query(_ROUND, params)
            if row is None:
                found = await self._query(
                    "SELECT holder, token FROM leader_lease WHERE name = %(name)s", params
                )
                self.holder = (found[0] or None) if found is not None else None
                if self.is_leader:
                    self.token = None  # taken over: its token is stale now, refuse writes at once
                return False
        except (psycopg.Error, OSError) as exc:
            self.last_error = _first_line(exc)
            return False
        token = int(row[0])
        if token != self.token:
            _log.info("lease_acquired", identity=self.identity, token=token, previous=self.holder)
        self.token, self.holder = token, self.identity
        return True

    async def _query(self, sql: str, params: dict[str, Any]) -> Any:
        async with self._lock:
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                conn = self._conn = await self._connect()
                await conn.execute(
                    "INSERT INTO leader_lease (name) VALUES (%(name)s) ON CONFLICT (name) DO NOTHING",
                    {"name": self.name},
                )
            cur = await conn.execute(sql, params)
            return await cur.fetchone()

    async def _release(self) -> None:
        params = {
            "me": self.identity,
            "mine": self.token if self.token is not None else -1,
            "name": self.name,
        }
        try:
            await self._query(
                f"UPDATE leader_lease SET holder = '', expires_at = {_NOW}"
                " WHERE name = %(name)s AND holder = %(me)s AND token = %(mine)s RETURNING token",
                params,
            )
            _log.info("lease_released", identity=self.identity)
        except (psycopg.Error, OSError) as exc:
            _log.warning("lease_release_failed", error=_first_line(exc))


def lease_from_settings(
    conninfo: str,
    password: str | None,
    *,
    name: str,
    identity: str,
    lease_duration_s: float,
    renew_deadline_s: float,
    retry_period_s: float,
    connect_timeout_s: float = 5.0,
) -> DatabaseLease:
    """The lease on the database at ``conninfo``, on a connection of its own (never blocked behind the
    store's statements; async, so a slow server never stalls the event loop)."""
    timeout_ms = max(1, int(retry_period_s * 1000))
    extra: dict[str, Any] = {"password": password} if password is not None else {}

    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            conninfo,
            autocommit=True,
            application_name="watchd-lease",
            connect_timeout=max(1, int(connect_timeout_s)),
            options=f"-c lock_timeout={timeout_ms} -c statement_timeout={timeout_ms}",
            **extra,
        )

    return DatabaseLease(
        connect,
        name=name,
        identity=identity,
        lease_duration_s=lease_duration_s,
        renew_deadline_s=renew_deadline_s,
        retry_period_s=retry_period_s,
    )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
