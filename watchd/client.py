"""Heartbeats from a training job to the local watchd agent. Standard library only: copy this file into a
training container as it is.

    from watchd.client import Heartbeat
    hb = Heartbeat()                      # job and rank from the environment (Slurm, torchrun, WATCHD_*)
    hb.step(step)                         # once per training step; with hb.phase("checkpoint"): save(...)

It never raises into the training loop and never blocks it: a report is put in a small bounded queue
(the oldest is dropped when full, and counted) that a daemon thread sends, at most one request every
``send_interval`` seconds (0.5) carrying all that queued meanwhile, to the agent's Unix socket
(``WATCHD_HEARTBEAT_SOCKET``, default ``/run/watchd/heartbeat.sock``) or, when there is none, to
``127.0.0.1:WATCHD_HEARTBEAT_PORT`` (default 9123; off unless the agent opens it) with the job's token
``WATCHD_HEARTBEAT_TOKEN`` (docs/security.md: the agent counts only reports that come from the job they name).
No agent: reports wait in the queue (the oldest dropped when it is full, and counted) while the thread
tries again with a back-off. At interpreter exit a ``done`` report says the rank finished (not hung).
See docs/heartbeats.md.

The engine's checkpoint advice for the job (docs/reliability.md), asked of the local agent, for a loop that
adapts its interval:

    from watchd.client import AdviceUnavailable, advised_checkpoint_interval
    try:
        every_s = advised_checkpoint_interval()
    except AdviceUnavailable as exc:      # exc.reason: no_job, no_agent, unknown_job, no_advice, ...
        print(f"no checkpoint advice ({exc}); keeping {every_s} s")
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

__all__ = ["AdviceUnavailable", "Heartbeat", "advised_checkpoint_interval", "checkpoint_advice"]

DEFAULT_SOCKET = "/run/watchd/heartbeat.sock"
DEFAULT_PORT = 9123
ENGINE_ADVICE_PATH = "/api/v1/reliability/job"  # the engine's (JOB_ADVICE_PATH in watchd.model.reliability)
ADVICE_PATH = "/v1/checkpoint-advice"  # the agent's, beside PATH
PATH = "/v1/heartbeat"
_JOB_VARS = ("WATCHD_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
_RANK_VARS = ("RANK", "SLURM_PROCID")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID")
_RETRY_MIN_S = 1.0
_RETRY_MAX_S = 30.0
_MAX_BATCH = 256

_log = logging.getLogger("watchd.client")


def _env_int(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def _env_job() -> str | None:
    for name in _JOB_VARS:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Heartbeat:
    """One rank's reporter. ``job``/``rank``/``local_rank`` default to the environment; ``gpu`` is the
    index of the GPU the rank uses as the node numbers them (``nvidia-smi``), when you know it."""

    def __init__(
        self,
        job: str | None = None,
        rank: int | None = None,
        *,
        local_rank: int | None = None,
        gpu: int | None = None,
        socket_path: str | None = None,
        port: int | None = None,
        queue_size: int = 64,
        timeout: float = 0.5,
        send_interval: float = 0.5,
        report_done_at_exit: bool = True,
        token: str | None = None,
    ) -> None:
        self.job = job if job is not None else _env_job()
        self.rank = rank if rank is not None else (_env_int(_RANK_VARS) or 0)
        self.local_rank = local_rank if local_rank is not None else _env_int(_LOCAL_RANK_VARS)
        self.gpu = gpu
        self.socket_path = socket_path or os.environ.get("WATCHD_HEARTBEAT_SOCKET") or DEFAULT_SOCKET
        env_port = os.environ.get("WATCHD_HEARTBEAT_PORT", "")
        self.port = port if port is not None else (int(env_port) if env_port.isdigit() else DEFAULT_PORT)
        self.timeout = timeout
        #: the job's heartbeat token (loopback HTTP only; on the socket the kernel says who we are)
        self.token = token if token is not None else (os.environ.get("WATCHD_HEARTBEAT_TOKEN") or None)
        #: at most one request per this many seconds, carrying every report queued meanwhile
        self.send_interval = max(0.0, send_interval)
        #: reports dropped: queue full (the oldest go), refused by the agent (4xx), or still queued when
        #: close() gave up on an unreachable agent; a failed request's reports are queued again, oldest first
        self.dropped = 0
        self.sent = 0
        self.requests = 0  #: requests made to the agent (each carries every report queued meanwhile)
        self._queue: collections.deque[dict[str, Any]] = collections.deque(maxlen=max(1, queue_size))
        self._queue_lock = threading.Lock()  # the training thread appends, the sender takes and puts back
        self._wake = threading.Event()  # a report queued, or close()
        self._closing = threading.Event()  # close(): cut the pause between requests short
        self._closed = False
        self._phase = "train"
        self._step = 0
        self._last_step_at: float | None = None
        self.enabled = self.job is not None
        if not self.enabled:
            _log.warning("watchd heartbeats off: no job id (set WATCHD_JOB_ID, or run under Slurm/torchrun)")
            return
        self._thread = threading.Thread(target=self._run, name="watchd-heartbeat", daemon=True)
        self._thread.start()
        if report_done_at_exit:
            atexit.register(self.close)

    # ------------------------------------------------------------------------------ the training side

    def step(
        self,
        step: int,
        step_time: float | None = None,
        compute_time: float | None = None,
        collective_seq: int | None = None,
    ) -> None:
        """Report a finished step. ``step_time`` defaults to the time since the previous call."""
        try:
            now = time.time()
            if step_time is None and self._last_step_at is not None:
                step_time = now - self._last_step_at
            self._last_step_at = now
            self._step = step
            report: dict[str, Any] = {"step": step, "time": now}
            if step_time is not None:
                report["step_time_s"] = max(0.0, float(step_time))
            if compute_time is not None:
                report["compute_time_s"] = max(0.0, float(compute_time))
            if collective_seq is not None:
                report["collective_seq"] = int(collective_seq)
            self._put(report)
        except Exception:  # a heartbeat must never stop training
            self.dropped += 1

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A quiet phase (``checkpoint``, ``eval``, ``init``): no steps in it is not a hang."""
        before = self._phase
        self.set_phase(name)
        try:
            yield
        finally:
            self.set_phase(before)
            self._last_step_at = None  # the phase's time is not a step's

    def set_phase(self, name: str) -> None:
        try:
            self._phase = name
            self._put({"step": self._step, "time": time.time()})
        except Exception:
            self.dropped += 1

    def close(self, timeout: float = 1.0) -> None:
        """Report ``done`` and give the thread up to ``timeout`` seconds to send what is queued."""
        if not self.enabled or self._closed:
            return
        self.set_phase("done")
        self._closed = True
        self._closing.set()
        self._wake.set()
        with contextlib.suppress(Exception):
            self._thread.join(timeout)

    # ------------------------------------------------------------------------------ the sending thread

    def _put(self, report: dict[str, Any]) -> None:
        if not self.enabled or self._closed:
            return
        report["job"] = self.job
        report["rank"] = self.rank
        report["phase"] = self._phase
        if self.local_rank is not None:
            report["local_rank"] = self.local_rank
        if self.gpu is not None:
            report["gpu"] = self.gpu
        with self._queue_lock:
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1
            self._queue.append(report)  # a full deque drops its oldest item
        self._wake.set()

    def _requeue(self, batch: list[dict[str, Any]]) -> None:
        """Put a batch whose request failed back in front of the queue (it is older than what queued
        meanwhile); what no longer fits is its oldest reports, dropped and counted."""
        with self._queue_lock:
            room = (self._queue.maxlen or 0) - len(self._queue)
            keep = batch[max(0, len(batch) - room) :] if room > 0 else []
            self.dropped += len(batch) - len(keep)
            self._queue.extendleft(reversed(keep))

    def _run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        not_before = 0.0  # monotonic: no request before (the send interval, or the back-off after a failure)
        delay = _RETRY_MIN_S
        while True:
            self._wake.wait()
            pause = not_before - time.monotonic()
            if pause > 0:  # meanwhile reports queue up (the oldest go when it is full): one request for all
                self._closing.wait(pause)
            self._wake.clear()
            batch: list[dict[str, Any]] = []
            with self._queue_lock:
                while self._queue and len(batch) < _MAX_BATCH:
                    batch.append(self._queue.popleft())
            if batch:
                try:
                    conn = conn or self._connect()
                    self._post(conn, batch)
                except Exception:  # unreachable, timed out, 5xx, a kept-alive connection closed: try again
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            conn.close()
                    conn = None
                    if self._closed:
                        self.dropped += len(batch) + len(self._queue)
                        self._queue.clear()
                        return
                    self._requeue(batch)
                    self._wake.set()  # sent again after the back-off, new reports or not
                    not_before = time.monotonic() + delay
                    delay = min(_RETRY_MAX_S, delay * 2)
                    continue  # reports keep queueing while the agent is away
                delay = _RETRY_MIN_S
                not_before = time.monotonic() + self.send_interval
            if self._queue:
                self._wake.set()
            elif self._closed:
                return

    def _connect(self) -> http.client.HTTPConnection:
        """The Unix socket when it can be used; loopback HTTP otherwise (no socket, or no permission)."""
        if os.path.exists(self.socket_path):
            unix = _UnixHTTPConnection(self.socket_path, self.timeout)
            try:
                unix.connect()
                return unix
            except OSError:
                unix.close()
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)

    def _post(self, conn: http.client.HTTPConnection, batch: list[dict[str, Any]]) -> None:
        body = json.dumps(batch, separators=(",", ":")).encode()
        self.requests += 1
        headers = {"Content-Type": "application/json"}
        if self.token and not isinstance(conn, _UnixHTTPConnection):
            headers["Authorization"] = f"Bearer {self.token}"
        conn.request("POST", PATH, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status >= 500:
            raise OSError(f"agent answered {resp.status}")
        if resp.status >= 400:  # refused (invalid, or the agent is full): retrying would not help
            self.dropped += len(batch)
        else:
            self.sent += len(batch)


# ------------------------------------------------------------------------------------- checkpoint advice


class AdviceUnavailable(Exception):
    """Why there is no checkpoint advice. ``reason`` is one of:

    - ``no_job``: no job id (none given, none in the environment);
    - ``no_agent``: the local agent cannot be reached (no socket, nothing listening);
    - ``refused``: the agent or the engine refused the caller (not in the job it names, a missing token);
    - ``unknown_job``: the engine has no heartbeats from the job (yet);
    - ``no_advice``: the engine knows the job but has no advice (no checkpoint cost measured or configured,
      no MTBF yet);
    - ``engine_unreachable``: the agent (or this process) could not ask the engine;
    - ``bad_answer``: an answer that is not the advice (a proxy's page, another service on the port).

    ``detail`` is the text of the answer or error."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _advice_request(
    job: str, url: str | None, socket_path: str | None, timeout: float, token: str | None
) -> tuple[int, Any]:
    """(status, decoded JSON) of asking the agent (default) or the engine at ``url``."""
    query = urllib.parse.urlencode({"job": job})
    if url is not None:
        request = urllib.request.Request(f"{url.rstrip('/')}{ENGINE_ADVICE_PATH}?{query}")
        token = token if token is not None else os.environ.get("WATCHD_VIEWER_TOKEN")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")
        except OSError as exc:
            raise AdviceUnavailable("engine_unreachable", f"{url}: {exc}") from None
    path = socket_path or os.environ.get("WATCHD_HEARTBEAT_SOCKET") or DEFAULT_SOCKET
    conn: http.client.HTTPConnection
    headers: dict[str, str] = {}
    if os.path.exists(path):
        conn = _UnixHTTPConnection(path, timeout)
        where = path
    else:
        port = _env_int(("WATCHD_HEARTBEAT_PORT",)) or DEFAULT_PORT
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        where = f"127.0.0.1:{port}"
        token = token if token is not None else os.environ.get("WATCHD_HEARTBEAT_TOKEN")
        if token:
            headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("GET", f"{ADVICE_PATH}?{query}", headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    except OSError as exc:
        raise AdviceUnavailable("no_agent", f"the watchd agent at {where}: {exc}") from None
    finally:
        conn.close()


def checkpoint_advice(
    job: str | None = None,
    *,
    url: str | None = None,
    socket_path: str | None = None,
    timeout: float = 2.0,
    token: str | None = None,
) -> dict[str, Any]:
    """The engine's checkpoint advice for ``job`` (default: from the environment, as :class:`Heartbeat`):
    a dict with ``advised_interval_s`` (Daly's interval, compute seconds between checkpoints),
    ``young_interval_s``, ``checkpoint_cost_s``, ``job_mtbf_hours``, ``current_interval_s``,
    ``waste_current`` and ``waste_advised`` (expected shares of compute lost), ``far_too_long``.

    By default it asks the local watchd agent, as heartbeats go (``socket_path``, else
    ``WATCHD_HEARTBEAT_SOCKET``, else /run/watchd/heartbeat.sock; with no socket 127.0.0.1:
    ``WATCHD_HEARTBEAT_PORT`` with ``WATCHD_HEARTBEAT_TOKEN``); the agent checks that the caller runs in the
    job and asks the engine with its own credential, so the job needs no engine address and no token.
    ``url`` (or ``WATCHD_ENGINE_URL``) asks that engine directly instead, with a viewer's ``token`` (else
    ``WATCHD_VIEWER_TOKEN``). Waits at most ``timeout`` seconds per request. Raises
    :class:`AdviceUnavailable` with the reason when there is no advice (never anything else)."""
    try:
        job = job if job is not None else _env_job()
        if not job:
            raise AdviceUnavailable("no_job", "no job id: pass job= or set WATCHD_JOB_ID or SLURM_JOB_ID")
        url = url if url is not None else (os.environ.get("WATCHD_ENGINE_URL") or None)
        status, doc = _advice_request(job, url, socket_path, timeout, token)
    except AdviceUnavailable:
        raise
    except Exception as exc:  # a proxy's HTML, a half-closed connection: reported, never a crash
        raise AdviceUnavailable("bad_answer", f"{type(exc).__name__}: {exc}") from None
    error = doc.get("error") if isinstance(doc, dict) else None
    if status == 200 and isinstance(doc, dict) and isinstance(doc.get("job"), dict):
        advice = doc["job"]
        if isinstance(advice.get("advised_interval_s"), int | float):
            return dict(advice)
        raise AdviceUnavailable("no_advice", str(advice.get("why") or "the engine has no advice for the job"))
    if status == 404 and error:
        raise AdviceUnavailable("unknown_job", str(error))
    if status in (401, 403):
        raise AdviceUnavailable("refused", str(error or f"answered {status}"))
    if status in (502, 503, 504):
        raise AdviceUnavailable("engine_unreachable", str(error or f"answered {status}"))
    raise AdviceUnavailable("bad_answer", f"answered {status}: {str(error or doc)[:200]}")


def advised_checkpoint_interval(
    job: str | None = None,
    *,
    url: str | None = None,
    socket_path: str | None = None,
    timeout: float = 2.0,
    token: str | None = None,
) -> float:
    """Daly's advised compute time between checkpoints for ``job``, in seconds (see
    :func:`checkpoint_advice`); raises :class:`AdviceUnavailable` with the reason when there is none."""
    advice = checkpoint_advice(job, url=url, socket_path=socket_path, timeout=timeout, token=token)
    return float(advice["advised_interval_s"])
