"""JSON over HTTP POST with bounded retries: the one place where watchd retries an outgoing notification.

:class:`WebhookSender` owns one ``aiohttp.ClientSession`` (use it as an async context manager). ``post``
never raises for an HTTP or network failure: the outcome is in the :class:`WebhookResult`.

- ``delivered``: a 2xx answer (3xx redirects are followed by aiohttp).
- ``rejected``: any other 4xx but 408 and 429: the request itself is wrong, sending it again cannot help,
  so it is not retried.
- ``failed``: connection error, timeout, 408, 429 or 5xx on every one of ``max_attempts`` attempts.

Between attempts the sender sleeps ``backoff * 2**(attempt-1)`` seconds (capped by ``max_backoff``, with
jitter), or the ``Retry-After`` of a 429/503 when it is given in seconds and not above ``max_backoff``.
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from watchd.logs import get_logger

_log = get_logger("watchd.webhook")

WebhookOutcome = Literal["delivered", "rejected", "failed"]
JSONBody = Mapping[str, object] | Sequence[Mapping[str, object]]

_RETRYABLE_4XX = frozenset({408, 429})
_BODY_EXCERPT = 300


@dataclass(frozen=True, slots=True)
class WebhookResult:
    url: str
    outcome: WebhookOutcome
    status: int | None = None  # HTTP status of the last attempt; None when no answer came
    attempts: int = 0
    error: str = ""  # why the last attempt failed ("" when delivered)
    elapsed: float = 0.0  # seconds, all attempts and waits included

    @property
    def ok(self) -> bool:
        return self.outcome == "delivered"


def redact_url(url: str) -> str:
    """``url`` without its user:password part, for logs and metric labels."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class WebhookSender:
    def __init__(
        self,
        *,
        timeout: float = 5.0,
        max_attempts: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        headers: Mapping[str, str] | None = None,
        user_agent: str = "watchd",
        log_failures: bool = True,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._headers = {"Content-Type": "application/json", "User-Agent": user_agent, **(headers or {})}
        self._session: aiohttp.ClientSession | None = None
        self._log_failures = log_failures  # False: the caller logs the outcome itself (with its context)
        self._tls = tls  # https: this context (a private CA, a client certificate); None: the defaults

    async def __aenter__(self) -> WebhookSender:
        self._ensure_session()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers=self._headers,
                connector=aiohttp.TCPConnector(ssl=self._tls) if self._tls is not None else None,
            )
        return self._session

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None and 0 <= retry_after <= self.max_backoff:
            return retry_after
        base = min(self.max_backoff, self.backoff * 2.0 ** (attempt - 1))
        return base * (0.5 + random.random() / 2)  # jitter: HA peers and engines do not retry in step

    async def post(
        self,
        url: str,
        payload: JSONBody,
        headers: Mapping[str, str] | None = None,
        *,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> WebhookResult:
        """POST ``payload`` as JSON to ``url``; retry transient failures. ``max_attempts`` (1 = no retry)
        and ``timeout`` (seconds per attempt) override the sender's for this call."""
        attempts_allowed = max(1, max_attempts if max_attempts is not None else self.max_attempts)
        per_attempt = self.timeout if timeout is None else timeout
        # only when given: aiohttp reads an explicit timeout=None as "no timeout at all"
        extra: dict[str, Any] = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
        body = json.dumps(payload, separators=(",", ":")).encode()
        session = self._ensure_session()
        loop = asyncio.get_running_loop()
        started = loop.time()
        shown = redact_url(url)
        status: int | None = None
        error = ""
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            try:
                async with session.post(url, data=body, headers=headers, **extra) as resp:
                    status = resp.status
                    if 200 <= status < 300:
                        await resp.read()
                        return WebhookResult(shown, "delivered", status, attempt, "", loop.time() - started)
                    text = (await resp.text(errors="replace"))[:_BODY_EXCERPT].strip()
                    error = f"HTTP {status}: {text}" if text else f"HTTP {status}"
                    if 400 <= status < 500 and status not in _RETRYABLE_4XX:
                        if self._log_failures:
                            _log.error("webhook_rejected", url=shown, status=status, response=text)
                        return WebhookResult(shown, "rejected", status, attempt, error, loop.time() - started)
                    retry_after = _retry_after(resp.headers.get("Retry-After"))
            except TimeoutError:
                status, error = None, f"timed out after {per_attempt:g}s"
            except aiohttp.ClientError as exc:
                status, error = None, f"{type(exc).__name__}: {exc}"
            if attempt >= attempts_allowed:
                if self._log_failures:
                    _log.warning("webhook_failed", url=shown, attempts=attempt, status=status, error=error)
                return WebhookResult(shown, "failed", status, attempt, error, loop.time() - started)
            delay = self._delay(attempt, retry_after)
            _log.debug("webhook_retry", url=shown, attempt=attempt, status=status, error=error, delay=delay)
            await asyncio.sleep(delay)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # an HTTP date: use our own backoff
