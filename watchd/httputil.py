"""Small aiohttp helpers shared by both daemons: /metrics (prometheus_client's own aiohttp handler, which
negotiates the text or OpenMetrics format and compression), a runner as an async context manager that
reports the port it bound, and what keeps a bad or slow client costing only itself:

* :class:`HttpLimits`: a deadline for a request's headers and one for its body, and a cap on the connections
  held at once (a client past the cap is closed at once; one that trickles its headers is closed when their
  deadline passes; a handler reads the body through :func:`read_body`, bounded by the body's deadline);
* requests that aiohttp's parser refuses (a bad ``Transfer-Encoding``, an unsupported ``Content-Encoding``, a
  malformed header) are answered 400 with a JSON reason and logged as one line, never with a traceback;
* :func:`json_response` never writes a bare ``NaN`` or ``Infinity`` (strict JSON parsers refuse them).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import platform
import resource
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server
from prometheus_client import (
    CollectorRegistry,
    Gauge,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.aiohttp import make_aiohttp_handler

from watchd import __version__
from watchd.logs import get_logger

_log = get_logger("watchd.http")


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one client may hold of a server (``docs/configuration.md``, ``http:``)."""

    header_timeout_s: float = 5.0  # from the connection (or the end of the previous request) to the headers
    body_timeout_s: float = 5.0  # to read a request's whole body
    max_connections: int = 512  # open at once; one more is closed as soon as it is accepted

    @classmethod
    def of(cls, config: Any) -> HttpLimits:
        """From a config section with the same fields (``watchd.http_settings.HttpConfig``)."""
        return cls(config.header_timeout_s, config.body_timeout_s, config.max_connections)


def metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    return make_aiohttp_handler(registry)


def standard_metrics(registry: CollectorRegistry, daemon: str) -> None:
    """What every exporter's users expect beside its own series (docs/gpu-metrics.md, "Every daemon"): the
    process's ``process_*`` (CPU, memory, open files, start time), ``python_info``, and
    ``watchd_build_info{daemon,version,python_version}`` (1), which dashboards and rules join on to find
    watchd's targets whatever their job is called. No ``*_created`` series: they double the counters and no
    rule reads them (prometheus_client's switch is process-wide; every registry of watchd wants it off)."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    Gauge(
        "watchd_build_info",
        "1, labelled with the daemon (engine or agent), its version and the Python it runs on.",
        ["daemon", "version", "python_version"],
        registry=registry,
    ).labels(daemon, __version__, platform.python_version()).set(1)


# ------------------------------------------------------------------------------------------------- JSON


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def strict_dumps(obj: Any) -> str:
    """JSON without bare NaN/Infinity: a non-finite number is written as null."""
    try:
        return json.dumps(obj, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(obj), allow_nan=False)


def json_response(data: Any, *, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=strict_dumps)


def error_response(status: int, reason: str) -> web.Response:
    return json_response({"error": reason}, status=status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def errors_as_json(failed_event: str) -> Middleware:
    """A middleware that answers every error as ``{"error": reason}``: aiohttp's own HTTP errors with their
    status, a body nested too deeply with 400, and a bug with 500 and one ``failed_event`` log line."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            return error_response(exc.status, exc.reason)
        except RecursionError:
            return error_response(400, "request nested too deeply")
        except Exception:
            _log.exception(failed_event, path=request.path)
            return error_response(500, "internal error")

    return middleware


# ------------------------------------------------------------------------------------------------- bodies


class BodyError(Exception):
    """A request body that could not be read: ``status`` and ``reason`` are the answer to give."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _encoding_reason(request: web.BaseRequest, exc: BaseException) -> str:
    encoding = request.headers.get("Content-Encoding", "").strip().lower()[:40] or "identity"
    if encoding in ("gzip", "deflate", "x-gzip"):
        return f"body is not valid {encoding} data (corrupt, or not compressed at all)"
    return f"body could not be read (Content-Encoding {encoding!r}): {str(exc)[:200]}"


async def read_body(request: web.BaseRequest, max_bytes: int, timeout_s: float) -> bytes:
    """The whole (decoded) body, at most ``max_bytes``, read within ``timeout_s``; BodyError otherwise (413
    too large, 400 not decodable or cut short, 408 too slow: then the connection is already closed)."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise BodyError(413, f"body larger than {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.content.iter_any():  # read() would stop at what is buffered
                size += len(chunk)
                if size > max_bytes:
                    raise BodyError(413, f"body larger than {max_bytes} bytes")
                chunks.append(chunk)
    except TimeoutError:
        _force_close(request)  # cut at once (no lingering over the rest of a trickled body)
        raise BodyError(408, f"body not received within {timeout_s:g} s") from None
    except (HttpProcessingError, RequestPayloadError, zlib.error) as exc:
        raise BodyError(400, _encoding_reason(request, exc)) from None
    except ConnectionError:
        raise BodyError(400, "body could not be read: connection lost") from None
    return b"".join(chunks)


#: the deadline of a request's body in an app (``http.body_timeout_s``), for the handlers that read one
BODY_TIMEOUT = web.AppKey("body_timeout_s", float)


async def read_json(request: web.Request, max_bytes: int) -> Any:
    """The request's body as JSON: read as :func:`read_body` does (at most ``max_bytes``, within the app's
    :data:`BODY_TIMEOUT`) and decoded as :func:`decode_json` does. BodyError (the answer to give) or
    ValueError (a 400 with its reason): never what a handler would answer 500, such as a plain body
    labelled gzip."""
    timeout_s = request.app.get(BODY_TIMEOUT, HttpLimits().body_timeout_s)
    return decode_json(request, await read_body(request, max_bytes, timeout_s))


def _force_close(request: web.BaseRequest) -> None:
    protocol = request.protocol
    if protocol is not None:
        protocol.force_close()


def decode_json(request: web.BaseRequest, raw: bytes) -> Any:
    """``raw`` (the decoded body of ``request``) as JSON; ValueError with a reason fit for a 400, also for
    what would otherwise raise RecursionError or the integer-digits ValueError deep inside the decoder. A
    compressed body that does not decode to JSON is named as such: aiohttp's decoder passes a gzip stream cut
    short without an error, and "malformed JSON" would point at the wrong layer."""
    try:
        return json.loads(raw)
    except RecursionError:
        detail = "nested too deeply"
    except UnicodeDecodeError as exc:
        detail = f"not UTF-8 ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        detail = str(exc)
    except ValueError as exc:  # int() past sys.get_int_max_str_digits()
        detail = str(exc)[:160]
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("gzip", "deflate", "x-gzip"):
        raise ValueError(f"corrupt or truncated {encoding} body, or no JSON inside it ({detail})")
    raise ValueError(f"malformed JSON: {detail}")


# ------------------------------------------------------------------------------------------- the server


class _GuardedHandler(RequestHandler):
    """aiohttp's connection handler, plus a deadline for the headers, a cap on connections, and parser
    errors answered as JSON without a traceback."""

    _limits: HttpLimits = HttpLimits()
    _header_timer: asyncio.TimerHandle | None = None
    _seen_requests = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        manager = self._manager
        if manager is not None and len(manager.connections) > self._limits.max_connections:
            _log.warning(
                "http_connection_refused", reason="max_connections", limit=self._limits.max_connections
            )
            transport.close()
            return
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self._loop.call_later(self._limits.header_timeout_s, self._headers_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        transport = self.transport
        if transport is not None:
            _log.info("http_headers_timeout", timeout_s=self._limits.header_timeout_s)
            self.force_close()  # may already drop the transport: close the one we held
            transport.close()

    def data_received(self, data: bytes) -> None:
        busy = self._request_in_progress or bool(self._messages)
        if not busy:
            self._arm_header_timer()  # the next request's headers start now
        super().data_received(data)
        if self._request_count != self._seen_requests:  # a request's headers are complete
            self._seen_requests = self._request_count
            self._disarm_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError | RequestPayloadError | ConnectionError):
            # a client's bad request or bad body (e.g. while the rest of an unread body is drained): one line
            _log.info("http_bad_request", error=f"{type(exc).__name__}: {exc}"[:300])
            return
        super().log_exception(*args, **kw)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500 or exc is None:
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, ContentEncodingError):
            encoding = request.headers.get("Content-Encoding", "")[:40]
            reason = f"unsupported Content-Encoding {encoding!r}: send gzip, deflate or identity"
        elif isinstance(exc, HttpProcessingError):
            reason = f"bad HTTP request: {exc.message}"[:300]
        else:
            reason = f"bad HTTP request: {type(exc).__name__}"
        _log.info("http_bad_request", peer=request.remote, status=status, reason=reason)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        resp = error_response(status, reason)
        resp.force_close()
        return resp


class _GuardedServer(Server):
    limits: HttpLimits = HttpLimits()

    def __call__(self) -> RequestHandler:
        handler = _GuardedHandler(self, loop=self._loop, **self._kwargs)
        handler._limits = self.limits
        return handler


#: descriptors kept for everything but connections (the database, logs, the scheduler's pipes)
_RESERVED_FDS = 128


def _within_open_files(limits: HttpLimits) -> HttpLimits:
    """``limits`` with the connection cap below the process's open-file limit, so that a flood of clients
    meets the cap (closed on accept) before the process runs out of descriptors (accept() failing, the
    database unable to open)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or limits.max_connections <= soft - _RESERVED_FDS:
        return limits
    cap = max(16, soft - _RESERVED_FDS)
    _log.warning(
        "http_max_connections_lowered",
        configured=limits.max_connections,
        effective=cap,
        open_files_limit=soft,
        hint="raise the open-file limit (systemd LimitNOFILE=) to serve more clients at once",
    )
    return HttpLimits(limits.header_timeout_s, limits.body_timeout_s, cap)


class GuardedRunner(web.AppRunner):
    """An AppRunner whose connections are held to ``limits``."""

    def __init__(self, app: web.Application, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(app, lingering_time=limits.body_timeout_s, **kwargs)
        self.limits = _within_open_files(limits)

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer  # the same object, handing out guarded connection handlers
        assert isinstance(server, _GuardedServer)
        server.limits = self.limits
        return server


@asynccontextmanager
async def serve(
    app: web.Application,
    host: str,
    port: int,
    limits: HttpLimits | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[int]:
    """Serve ``app`` (over TLS with ``ssl_context``) and yield the bound port (useful with port 0); cleanup
    on exit, bounded."""
    runner = GuardedRunner(app, limits or HttpLimits(), access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname()[1] if sockets else port
        yield int(bound)
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------- credentials and TLS

#: what a request needs: the agents' ingest, a read, an operator's call, /metrics, /healthz and /readyz, an
#: agent's read of its job's advice, an agent's own call (its commands and their results)
Need = Literal["ingest", "read", "operate", "metrics", "health", "agent_read", "agent"]
Role = Literal["agent", "viewer", "operator", "anyone"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: ``name`` is what the audit records; ``bound`` when the credential names
    the person (a named operator token), not when the caller's header does."""

    name: str
    role: Role
    bound: bool = False


@dataclass(frozen=True)
class Credentials:
    """The engine's tokens (docs/security.md). ``shared``: the agents' token; ``operators``/``viewers``:
    token -> name. No credential at all: everything is open (a demo)."""

    shared: str | None = None
    operators: dict[str, str] = field(default_factory=dict)
    viewers: dict[str, str] = field(default_factory=dict)
    open_metrics: bool = True
    open_health: bool = True

    @property
    def open(self) -> bool:
        return self.shared is None and not self.operators and not self.viewers

    def identify(self, authorization: str) -> Principal | None:
        """The holder of the ``Authorization`` header's bearer token; None when it is none of ours."""
        given = authorization.encode("utf-8", "surrogateescape")
        found: Principal | None = None
        # every comparison runs (constant time in which token matched)
        for table, role in ((self.operators, "operator"), (self.viewers, "viewer")):
            for token, name in table.items():
                if hmac.compare_digest(given, f"Bearer {token}".encode()) and found is None:
                    found = Principal(name, role, bound=True)  # type: ignore[arg-type]
        if self.shared is not None and hmac.compare_digest(given, f"Bearer {self.shared}".encode()):
            # the agents' token; it also operates while no operator is named (unbound: the header names)
            found = found or Principal("agent", "agent")
        return found

    def allows(self, principal: Principal | None, need: Need) -> bool:
        if self.open:
            return True
        if (need == "metrics" and self.open_metrics) or (need == "health" and self.open_health):
            return True
        if principal is None:
            return False
        role = principal.role
        if need in ("ingest", "agent"):  # the agents' alone: never a viewer's or an operator's
            return role == "agent"
        if need == "agent_read":  # what an agent asks for a job on its node (one job's checkpoint advice)
            return role in ("agent", "operator", "viewer")
        legacy = not self.operators and not self.viewers  # the shared token does everything
        if need == "operate":
            return role == "operator" or (legacy and role == "agent")
        return role in ("operator", "viewer") or (legacy and role == "agent")  # read, metrics, health


#: who sent a request, set by :func:`auth_middleware`
PRINCIPAL = web.RequestKey("principal", Principal)


def need_of(
    request: web.BaseRequest,
    ingest_path: str,
    agent_reads: Collection[str] = (),
    agent_prefix: str | None = None,
) -> Need:
    """What a request needs; ``agent_reads``: the GET paths an agent's token may read too; ``agent_prefix``:
    the paths of the agents' own calls (their commands), the agents' token's alone."""
    path = request.path
    if path == ingest_path:
        return "ingest"
    if agent_prefix is not None and path.startswith(agent_prefix):
        return "agent"
    if path in agent_reads and request.method in ("GET", "HEAD"):
        return "agent_read"
    if path == "/metrics":
        return "metrics"
    if path in ("/healthz", "/readyz"):
        return "health"
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        return "operate"
    return "read"


def auth_middleware(
    credentials: Credentials,
    ingest_path: str,
    on_denied: Callable[[web.BaseRequest, Need], None] = lambda r, n: None,
    agent_reads: Collection[str] = (),
    agent_prefix: str | None = None,
) -> Middleware:
    """Every request: who sent it (``request["principal"]``) and whether they may; 401 without a
    credential we know, 403 with one that may not do this."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        need = need_of(request, ingest_path, agent_reads, agent_prefix)
        principal = credentials.identify(request.headers.get("Authorization", ""))
        if credentials.allows(principal, need):
            request[PRINCIPAL] = principal or Principal("anonymous", "anyone")
            return await handler(request)
        on_denied(request, need)
        if principal is None:
            return error_response(401, "missing or wrong bearer token")
        return error_response(403, f"this token ({principal.role}) may not {need} here")

    return middleware


def server_tls(cert: Path | None, key: Path | None, client_ca: Path | None = None) -> ssl.SSLContext | None:
    """The server's TLS context (TLS 1.2 or later); with ``client_ca``, clients must present a
    certificate it signed (mutual TLS). None without a certificate."""
    if cert is None or key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_tls(ca_file: Path | None, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A client's TLS context: the server verified against ``ca_file`` (the system's CAs without it), host
    name checked; ``cert``/``key`` presented for mutual TLS."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None and key is not None:
        context.load_cert_chain(cert, key)
    return context
