"""The agent asks the engine for one job's checkpoint advice, with its own engine token (the engine lets the
agents' token read that one path: :data:`watchd.model.reliability.JOB_ADVICE_PATH`), for the job's ranks
that asked over the heartbeat endpoint (docs/heartbeats.md)."""

from __future__ import annotations

import ssl
from typing import Any, Protocol

import aiohttp

from watchd.model.reliability import JOB_ADVICE_PATH

__all__ = ["AdviceSource", "EngineAdvice"]


class AdviceSource(Protocol):
    async def __call__(self, job: str) -> tuple[int, dict[str, Any]]:
        """The HTTP status and JSON document to answer a rank with."""
        ...


class EngineAdvice:
    """:class:`AdviceSource` over HTTP to the engine. An engine that cannot be reached, or answers what is
    not JSON, becomes a 502 with the reason; the engine's own answers (200, 404 for a job it does not know)
    pass through."""

    def __init__(
        self, url: str, token: str | None, timeout_s: float, tls: ssl.SSLContext | None = None
    ) -> None:
        self.endpoint = url.rstrip("/") + JOB_ADVICE_PATH
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._tls = tls
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, job: str) -> tuple[int, dict[str, Any]]:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._tls) if self._tls is not None else None
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        try:
            async with self._session.get(self.endpoint, params={"job": job}, headers=self._headers) as resp:
                doc = await resp.json(content_type=None)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return 502, {"error": f"the engine cannot be reached: {type(exc).__name__}: {exc}".rstrip(": ")}
        except ValueError:
            return 502, {"error": f"the engine answered {resp.status} with no JSON"}
        if not isinstance(doc, dict):
            return 502, {"error": f"the engine answered {status} with no JSON object"}
        if status in (401, 403):  # the agent's token: the operator's problem, not the job's
            return 502, {"error": f"the engine refused the agent's token ({status}): {doc.get('error', '')}"}
        return status, doc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
