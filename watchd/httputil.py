"""Small aiohttp helpers shared by both daemons: /metrics (prometheus_client's own aiohttp handler, which
negotiates the text or OpenMetrics format and compression) and a runner as an async context manager that
reports the port it bound."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler


def metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    return make_aiohttp_handler(registry)


@asynccontextmanager
async def serve(app: web.Application, host: str, port: int) -> AsyncIterator[int]:
    """Serve ``app`` and yield the bound port (useful with port 0); cleanup on exit, bounded."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname()[1] if sockets else port
        yield int(bound)
    finally:
        await runner.cleanup()
