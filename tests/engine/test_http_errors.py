"""Bad HTTP input costs only itself (issue 16 items 9 and 11), in process over loopback: a 400 with a JSON
reason (never a 500, never a traceback), deadlines for headers and bodies, a cap on connections."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.support import xid_event
from watchd.config import EngineConfig, IngestConfig
from watchd.credentials import TokenSource
from watchd.engine.runner import Engine
from watchd.http_settings import HttpConfig, Listen
from watchd.httputil import strict_dumps
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.events import INGEST_PATH, batch_to_wire

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    config = EngineConfig(
        listen=Listen(port=0),
        auth=TokenSource(token=TOKEN),
        ingest=IngestConfig(max_body_bytes=256 * 1024),
        http=HttpConfig(header_timeout_s=0.5, body_timeout_s=0.5, max_connections=20),
    )
    async with Engine(config, scheduler=FakeScheduler()) as e:
        yield e


def _batch() -> bytes:
    return json.dumps(batch_to_wire("gpu-1", [xid_event("gpu-1", xid=13)])).encode()


async def _post(
    engine: Engine, body: bytes, headers: dict[str, str], path: str = INGEST_PATH
) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(auto_decompress=False) as s,
        s.post(f"http://127.0.0.1:{engine.port}{path}", data=body, headers={**AUTH, **headers}) as r,
    ):
        return r.status, await r.text()


async def _raw(engine: Engine, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", engine.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


CASES = {
    "deep_nesting": (
        b'{"version": 1, "events": [' + b"[" * 50_000 + b"]" * 50_000 + b"]}",
        {},
        "nested too deeply",
    ),
    "int_over_4300_digits": (b'{"version": 1, "events": [' + b"9" * 5000 + b"]}", {}, "digits"),
    "plain_body_labelled_gzip": (
        b'{"version": 1, "events": []}',
        {"Content-Encoding": "gzip"},
        "not valid gzip",
    ),
    "short_corrupt_gzip": (
        gzip.compress(b"{}" * 100)[:12],
        {"Content-Encoding": "gzip"},
        "corrupt or truncated",
    ),
    "brotli": (b"\x8b\x03\x80{}", {"Content-Encoding": "br"}, "Content-Encoding"),
    "zstd": (b"\x28\xb5\x2f\xfd{}", {"Content-Encoding": "zstd"}, "Content-Encoding"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_bad_bodies_get_400_with_a_json_reason_and_no_traceback(
    engine: Engine, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    body, headers, fragment = CASES[case]
    with caplog.at_level(logging.DEBUG):
        status, text = await _post(engine, body, headers)
    assert status == 400, text
    reason = json.loads(text)["error"]
    assert fragment in reason
    if "gzip" in case:
        assert "malformed JSON" not in reason
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    status, _ = await _post(engine, _batch(), {})  # and the engine serves on
    assert status == 200


async def test_a_0xff_byte_in_authorization_is_401(engine: Engine) -> None:
    body = _batch()
    reply = await _raw(
        engine,
        b"POST /api/v1/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer \xff\xfe\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body,
    )
    assert reply.split(b" ")[1] in (b"400", b"401"), reply[:200]


@pytest.mark.parametrize("te", [b"application/json", b"chunked, gzip", b"\xe9"])
async def test_a_bad_transfer_encoding_gets_400_as_json(engine: Engine, te: bytes) -> None:
    reply = await _raw(
        engine, b"GET /api/v1/actions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + te + b"\r\n\r\n"
    )
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400", reply[:200]
    assert "error" in json.loads(body)


@pytest.mark.parametrize(
    ("held_id", "status"), [("99999999999999999999", 400), ("-1", 400), ("1e3", 400), ("7", 404)]
)
async def test_held_ids_past_64_bits_get_400(engine: Engine, held_id: str, status: int) -> None:
    got, text = await _post(engine, b"", {"X-Watchd-Operator": "op"}, f"/api/v1/held/{held_id}/release")
    assert got == status, text


def test_json_answers_never_carry_a_bare_nan() -> None:
    text = strict_dumps({"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": float("-inf")}})
    assert json.loads(text, parse_constant=lambda t: pytest.fail(f"bare {t}")) == {
        "a": None,
        "b": [None, 1.5],
        "c": {"d": None},
    }


async def _connections_open(engine: Engine, n: int, first: bytes) -> list[asyncio.StreamWriter]:
    writers = []
    for _ in range(n):
        _, writer = await asyncio.open_connection("127.0.0.1", engine.port)
        writer.write(first)
        writers.append(writer)
    return writers


async def _closed(writer: asyncio.StreamWriter, within_s: float, trickle: bytes = b" ") -> bool:
    reader = writer._protocol._stream_reader  # type: ignore[attr-defined]
    try:
        async with asyncio.timeout(within_s):
            while True:
                writer.write(trickle)
                if not await reader.read(1024):
                    return True
    except (TimeoutError, ConnectionError):
        return writer.is_closing() or reader.at_eof()


@pytest.mark.parametrize(
    "first",
    [
        b"POST /api/v1/events HTTP/1.1\r\nHost: x\r\nX-Pad: ",  # headers never end (a value trickled)
        b"POST /api/v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{",  # body never ends
    ],
    ids=["headers", "body"],
)
async def test_trickling_clients_are_cut(engine: Engine, first: bytes) -> None:
    writers = await _connections_open(engine, 10, first)
    started = asyncio.get_running_loop().time()
    try:
        assert all(await asyncio.gather(*(_closed(w, 3.0, b"a") for w in writers)))
        assert asyncio.get_running_loop().time() - started >= 0.4  # cut by the deadline, not refused at once
    finally:
        for w in writers:
            w.close()
    status, _ = await _post(engine, _batch(), {})
    assert status == 200


async def test_connections_past_the_cap_are_closed_at_once(engine: Engine) -> None:
    writers = await _connections_open(engine, 30, b"")
    try:
        await asyncio.sleep(0.1)
        closed = await asyncio.gather(*(_closed(w, 0.2) for w in writers))
        assert sum(closed) >= 10, closed  # 20 allowed, the rest closed on accept
    finally:
        for w in writers:
            w.close()
