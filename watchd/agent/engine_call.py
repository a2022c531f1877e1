"""The agent's calls to the engine (the shipper's batches, the command poller's polls and reports): the
session they go through, and one call's answer: its status class and its reply read up to a bound, or why
the engine was not reached."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

#: what a call that did not reach the engine raises (refused, reset, timed out, a TLS failure)
UNREACHABLE = (TimeoutError, aiohttp.ClientError, OSError)
#: statuses that say "not now": the same request may succeed later
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})

OK = "ok"
TOO_LARGE = "too_large"
BUSY = "busy"
UNAUTHORIZED = "unauthorized"
NOT_FOUND = "not_found"
REFUSED = "refused"
NOT_REACHED = "not_reached"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int | None  # None: the engine was not reached
    body: bytes = b""
    error: str = ""  # why it was not reached

    @property
    def kind(self) -> str:
        """The answer's class: ``ok`` (2xx), ``too_large`` (413), ``busy`` (:data:`RETRYABLE`),
        ``unauthorized`` (401, 403), ``not_found`` (404), ``refused`` (any other), ``not_reached``."""
        status = self.status
        if status is None:
            return NOT_REACHED
        if 200 <= status < 300:
            return OK
        if status == 413:
            return TOO_LARGE
        if status in RETRYABLE:
            return BUSY
        if status in (401, 403):
            return UNAUTHORIZED
        return NOT_FOUND if status == 404 else REFUSED

    def text(self, limit: int | None = None) -> str:
        """The reply as text (its first ``limit`` bytes), for a log line."""
        return self.body[:limit].decode("utf-8", "replace")


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    timeout: aiohttp.ClientTimeout,
    read_at_most: int | None = None,
    **request: Any,
) -> Reply:
    """One request to the engine; its reply read whole, or its first ``read_at_most`` bytes."""
    try:
        async with session.request(method, url, timeout=timeout, **request) as resp:
            body = await (resp.read() if read_at_most is None else resp.content.read(read_at_most))
            return Reply(resp.status, body)
    except UNREACHABLE as exc:
        return Reply(None, error=str(exc) or type(exc).__name__)


async def with_session(
    session: aiohttp.ClientSession | None,
    tls: ssl.SSLContext | None,
    timeout: aiohttp.ClientTimeout,
    use: Callable[[aiohttp.ClientSession], Awaitable[None]],
) -> None:
    """``use(session)`` when one is given (shared by many callers, opened and closed by its owner), else with
    a session of its own for ``tls`` (an https:// engine: its CA, and the agent's certificate)."""
    if session is not None:
        await use(session)
        return
    connector = aiohttp.TCPConnector(ssl=tls) if tls is not None else None
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as own:
        await use(own)
