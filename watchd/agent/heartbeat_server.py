"""The heartbeat endpoint: ``POST /v1/heartbeat`` on a Unix socket and on 127.0.0.1, feeding the coalescer.

Optional by nature: an endpoint that cannot be opened (socket in use, no permission) is logged and reported as
``watchd_agent_heartbeat_endpoint_up{endpoint="socket"|"http"} 0`` (``watchd_source_up{source="heartbeat"}``
is 0 when neither opened); the agent goes on with its other sources.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from watchd.agent.advice import AdviceSource
from watchd.agent.heartbeat import Coalescer, Report, ReportError, parse_reports
from watchd.agent.heartbeat_auth import (
    IDENTITIES,
    JobIdentity,
    Peer,
    Verdict,
    judge,
    peer_credentials,
)
from watchd.agent.metrics import AgentMetrics
from watchd.agent.settings import HeartbeatConfig
from watchd.clock import Clock
from watchd.httputil import (
    BodyError,
    GuardedRunner,
    HttpLimits,
    decode_json,
    error_response,
    errors_as_json,
    json_response,
    read_body,
)
from watchd.logs import get_logger
from watchd.model.events import Event

_log = get_logger("watchd.heartbeat")

PATH = "/v1/heartbeat"
ADVICE_PATH = "/v1/checkpoint-advice"  # a job's checkpoint advice, asked of the engine for it
MAX_BODY_BYTES = 256 * 1024
MAX_REPORTS_PER_REQUEST = 1024
_TICK_MAX_S = 0.25


class HeartbeatServer:
    def __init__(
        self,
        config: HeartbeatConfig,
        node: str,
        clock: Clock,
        metrics: AgentMetrics,
        emit: Callable[[Event], None],
        identity: JobIdentity | None = None,
        advice: AdviceSource | None = None,
    ) -> None:
        """``identity``: who a socket peer is (default: the configured one, ``/proc``); ``advice``: where a
        job's checkpoint advice comes from (the engine; None: ``GET ADVICE_PATH`` answers 503)."""
        self.config = config
        self.advice = advice
        self.coalescer = Coalescer(
            node,
            clock,
            forward_interval_s=config.forward_interval_s,
            max_ranks=config.max_ranks,
            forget_after_s=config.forget_after_s,
            max_ranks_per_job=config.max_ranks_per_job if config.verify else None,
        )
        self.identity = identity or IDENTITIES[config.identity](config.proc_root)
        secret = config.token_secret.resolve("heartbeat.token_secret") if config.verify else None
        self._secret = secret.encode() if secret is not None else None
        self._clock = clock
        self._metrics = metrics
        self._emit = emit
        self._up = metrics.source_up.labels("heartbeat")
        self._runner: web.AppRunner | None = None
        self._limits = HttpLimits.of(config.http)
        self._ticker: asyncio.Task[None] | None = None
        self.http_port = 0  # bound port, 0 when off

    async def start(self) -> None:
        app = web.Application(
            client_max_size=MAX_BODY_BYTES, middlewares=[errors_as_json("heartbeat_request_failed")]
        )
        app.router.add_post(PATH, self._handle)
        app.router.add_get(ADVICE_PATH, self._advice)
        self._runner = GuardedRunner(app, self._limits, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        opened = []
        if not self.config.verify:
            _log.warning(
                "heartbeat_unverified",
                hint="heartbeat.verify is false: any local process may report for any job (docs/security.md)",
            )
        if self.config.socket is not None:
            with self._failure_logged("socket", str(self.config.socket)):
                await self._open_socket(self.config.socket)
                opened.append(str(self.config.socket))
        if self.config.http_port:
            with self._failure_logged("http", f"127.0.0.1:{self.config.http_port}"):
                site = web.TCPSite(self._runner, "127.0.0.1", self.config.http_port)
                await site.start()
                self.http_port = self.config.http_port
                opened.append(f"127.0.0.1:{self.http_port}")
        self._up.set(1 if opened else 0)
        self._ticker = asyncio.create_task(self._tick(), name="heartbeat-forward")
        _log.info("heartbeat_listening", endpoints=opened)

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for event in self.coalescer.due():
            self._emit(event)
        if self._runner is not None:
            await self._runner.cleanup()
        if self.config.socket is not None:
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(self.config.socket).st_mode):
                    os.unlink(self.config.socket)

    @contextlib.contextmanager
    def _failure_logged(self, endpoint: str, where: str):  # type: ignore[no-untyped-def]
        up = self._metrics.heartbeat_endpoint_up.labels(endpoint)
        try:
            yield
        except OSError as exc:
            up.set(0)
            _log.error(
                "heartbeat_endpoint_failed",
                endpoint=endpoint,
                at=where,
                error=str(exc),
                hint="training ranks cannot report here; the agent runs on without it (docs/heartbeats.md)",
            )
        else:
            up.set(1)

    async def _open_socket(self, path: Path) -> None:
        mode = self.config.socket_permissions
        group = socket_group_id(self.config.socket_group) if self.config.socket_group is not None else None
        _prepare_socket_path(path, mode, group)
        assert self._runner is not None
        await web.UnixSite(self._runner, str(path)).start()
        if group is not None:
            os.chown(path, -1, group)
        os.chmod(path, mode)

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            raw = await read_body(request, MAX_BODY_BYTES, self._limits.body_timeout_s)
        except BodyError as exc:
            self._metrics.heartbeats.labels("invalid").inc()
            return error_response(exc.status, exc.reason)
        try:
            body = decode_json(request, raw)
        except ValueError as exc:
            self._metrics.heartbeats.labels("invalid").inc()
            return error_response(400, str(exc))
        try:
            reports = parse_reports(body, self._clock.now(), MAX_REPORTS_PER_REQUEST)
        except ReportError as exc:
            self._metrics.heartbeats.labels("invalid").inc()
            return error_response(400, f"invalid report: {exc}")
        accepted = refused = 0
        rejected: dict[str, int] = {}
        verdicts = self._verdicts(request, reports)
        for report, verdict in zip(reports, verdicts, strict=True):
            if not verdict.ok:  # never evidence, never a slot
                assert verdict.reason is not None
                rejected[verdict.reason] = rejected.get(verdict.reason, 0) + 1
                continue
            events = self.coalescer.offer(report, verdict.owner)
            if events is None:
                refused += 1
                continue
            accepted += 1
            for event in events:
                self._emit(event)
        self._metrics.heartbeats.labels("accepted").inc(accepted)
        self._metrics.heartbeat_ranks.set(len(self.coalescer))
        if rejected:
            for reason, n in rejected.items():
                self._metrics.heartbeats_rejected.labels(reason).inc(n)
            first = next(iter(rejected))
            _log.info("heartbeat_rejected", reasons=rejected)
            return json_response(
                {
                    "error": f"reports not from the job they name ({first}); see docs/security.md",
                    "accepted": accepted,
                    "rejected": rejected,
                },
                status=403,
            )
        if refused:
            self._metrics.heartbeats.labels("refused_capacity").inc(refused)
            return json_response(
                {
                    "error": f"the agent tracks {self.config.max_ranks} ranks already (heartbeat.max_ranks); "
                    "reports of new ranks are refused",
                    "accepted": accepted,
                    "refused": refused,
                },
                status=429,
            )
        return json_response({"accepted": accepted})

    async def _advice(self, request: web.Request) -> web.Response:
        """``GET /v1/checkpoint-advice?job=J``: the engine's checkpoint advice for J, asked with the agent's
        own engine token, for a caller in J (the same checks as a heartbeat report's)."""
        job = request.query.get("job", "")
        if not job:
            return json_response({"error": "job: required", "reason": "no_job"}, status=400)
        (verdict,) = self._verdicts(request, [job])
        if not verdict.ok:
            self._metrics.heartbeats_rejected.labels(str(verdict.reason)).inc()
            return json_response(
                {
                    "error": f"not asked from the job it names ({verdict.reason}); see docs/security.md",
                    "reason": "refused",
                },
                status=403,
            )
        if self.advice is None:
            return json_response(
                {"error": "this agent does not ask the engine for advice", "reason": "engine_unreachable"},
                status=503,
            )
        status, doc = await self.advice(job)
        return json_response(doc, status=status)

    def _verdicts(self, request: web.Request, jobs: list[Report] | list[str]) -> list[Verdict]:
        names = [j if isinstance(j, str) else j.job for j in jobs]
        if not self.config.verify:
            return [Verdict(None) for _ in names]
        transport = request.transport
        sock: Any = transport.get_extra_info("socket") if transport is not None else None
        tcp = sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6)
        if tcp:
            header = request.headers.get("Authorization")
            return [judge(job, tcp=True, authorization=header, secret=self._secret) for job in names]
        peer: Peer | None = peer_credentials(sock)
        identity = self.identity.identify(peer.pid) if peer is not None else None
        return [judge(job, peer=peer, identity=identity) for job in names]

    async def _tick(self) -> None:
        period = min(_TICK_MAX_S, self.config.forward_interval_s / 4)
        while True:
            await asyncio.sleep(period)
            for event in self.coalescer.due():
                self._emit(event)
            self._metrics.heartbeat_ranks.set(len(self.coalescer))


def socket_group_id(group: str | int) -> int:
    """The gid of ``heartbeat.socket_group`` (a name, or a gid that must exist on this host); an OSError
    naming the key and the group when there is none."""
    try:
        return grp.getgrgid(group).gr_gid if isinstance(group, int) else grp.getgrnam(group).gr_gid
    except KeyError:
        raise OSError(f"heartbeat.socket_group: no group {group!r} on this host") from None


def _prepare_socket_path(path: Path, mode: int, group: int | None = None) -> None:
    # A folder the agent creates is searchable by whoever may write to the socket (docs/heartbeats.md).
    folder_mode = 0o700 | (0o050 if mode & 0o060 else 0) | (0o001 if mode & 0o006 else 0)
    if not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        if group is not None:
            os.chown(path.parent, -1, group)
        os.chmod(path.parent, folder_mode)  # mkdir's mode is cut by the umask
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise OSError(f"{path} exists and is not a socket")
        if _socket_answers(path):
            raise OSError(f"another process serves {path}")
        path.unlink()  # left behind by an agent that was killed


def _socket_answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
        except OSError:
            return False
        return True
