"""WebhookSender against a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from tests.harness.alertmanager import free_port
from watchd.httputil import serve
from watchd.integrations.webhook.sender import WebhookSender, redact_url


class Server:
    """Answers POST /<name> from a script of statuses per path (then 200); records every request."""

    def __init__(self) -> None:
        self.script: dict[str, list[int | str]] = {}
        self.requests: list[tuple[str, Any, dict[str, str]]] = []
        self.url = ""
        self.release = asyncio.Event()  # set at teardown: hanging handlers return

    async def handle(self, request: web.Request) -> web.Response:
        path = request.match_info["name"]
        self.requests.append((path, await request.json(), dict(request.headers)))
        steps = self.script.get(path, [])
        step = steps.pop(0) if steps else 200
        if step == "hang":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), 5)
            step = 200
        if step == "busy":
            return web.Response(status=429, headers={"Retry-After": "0"}, text="slow down")
        assert isinstance(step, int)
        return web.json_response({"ok": step == 200}, status=step)

    def count(self, path: str) -> int:
        return sum(1 for p, _, _ in self.requests if p == path)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    app = web.Application()
    app.router.add_post("/{name}", srv.handle)
    async with serve(app, "127.0.0.1", 0) as port:
        srv.url = f"http://127.0.0.1:{port}"
        try:
            yield srv
        finally:
            srv.release.set()


@pytest.fixture
async def sender() -> AsyncIterator[WebhookSender]:
    async with WebhookSender(timeout=0.3, max_attempts=3, backoff=0.01, max_backoff=0.05) as s:
        yield s


async def test_success(server: Server, sender: WebhookSender) -> None:
    payload = {"node": "gpu-1", "xid": 79, "nested": {"a": [1, 2]}}
    res = await sender.post(f"{server.url}/ok", payload, headers={"X-Token": "t"})
    assert res.ok
    assert (res.outcome, res.status, res.attempts, res.error) == ("delivered", 200, 1, "")
    [(path, body, headers)] = server.requests
    assert (path, body) == ("ok", payload)
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Token"] == "t"


async def test_server_error_then_success_is_retried(server: Server, sender: WebhookSender) -> None:
    server.script["flaky"] = [500, 502]
    res = await sender.post(f"{server.url}/flaky", {"a": 1})
    assert (res.outcome, res.status, res.attempts) == ("delivered", 200, 3)
    assert server.count("flaky") == 3


async def test_429_is_retried(server: Server, sender: WebhookSender) -> None:
    server.script["busy"] = ["busy"]
    res = await sender.post(f"{server.url}/busy", {"a": 1})
    assert (res.outcome, res.attempts) == ("delivered", 2)


async def test_persistent_server_error_fails_after_max_attempts(
    server: Server, sender: WebhookSender
) -> None:
    server.script["down"] = [503, 503, 503, 503]
    res = await sender.post(f"{server.url}/down", {"a": 1})
    assert (res.outcome, res.status, res.attempts) == ("failed", 503, 3)
    assert "HTTP 503" in res.error
    assert server.count("down") == 3
    one = await sender.post(f"{server.url}/down", {"a": 1}, max_attempts=1)
    assert (one.outcome, one.attempts) == ("failed", 1)


async def test_bad_request_is_not_retried(server: Server, sender: WebhookSender) -> None:
    server.script["bad"] = [400]
    res = await sender.post(f"{server.url}/bad", {"a": 1})
    assert (res.outcome, res.status, res.attempts) == ("rejected", 400, 1)
    assert "HTTP 400" in res.error
    assert server.count("bad") == 1


async def test_timeout_is_retried_then_fails(server: Server, sender: WebhookSender) -> None:
    server.script["slow"] = ["hang", "hang", "hang"]
    t = time.monotonic()
    res = await sender.post(f"{server.url}/slow", {"a": 1})
    elapsed = time.monotonic() - t
    assert (res.outcome, res.status, res.attempts) == ("failed", None, 3)
    assert "timed out" in res.error
    assert 0.9 <= elapsed < 2.0  # 3 x 0.3 s + small backoff
    assert res.elapsed == pytest.approx(elapsed, abs=0.1)


async def test_a_call_s_timeout_overrides_the_sender_s(server: Server, sender: WebhookSender) -> None:
    server.script["slow3"] = ["hang"]
    t = time.monotonic()
    res = await sender.post(f"{server.url}/slow3", {"a": 1}, max_attempts=1, timeout=0.1)
    assert (res.outcome, res.attempts) == ("failed", 1)
    assert res.error == "timed out after 0.1s" and time.monotonic() - t < 0.28  # the sender's is 0.3 s


async def test_timeout_then_success(server: Server, sender: WebhookSender) -> None:
    server.script["slow2"] = ["hang"]
    res = await sender.post(f"{server.url}/slow2", {"a": 1})
    assert (res.outcome, res.attempts) == ("delivered", 2)


async def test_connection_refused(sender: WebhookSender) -> None:
    url = f"http://127.0.0.1:{free_port()}/x"
    res = await sender.post(url, {"a": 1})
    assert (res.outcome, res.status, res.attempts) == ("failed", None, 3)
    assert "Connect" in res.error


async def test_session_outside_context_and_reuse() -> None:
    s = WebhookSender(timeout=0.2, max_attempts=1)
    res = await s.post(f"http://127.0.0.1:{free_port()}/x", [{"a": 1}])
    assert res.outcome == "failed"
    await s.aclose()
    await s.aclose()  # twice is fine
    with pytest.raises(ValueError):
        WebhookSender(max_attempts=0)


def test_redact_url() -> None:
    assert redact_url("http://user:secret@am.example:9093/p") == "http://am.example:9093/p"
    assert redact_url("http://am.example:9093") == "http://am.example:9093"
