"""A real Prometheus Alertmanager on loopback, for tests.

Debian's ``prometheus-alertmanager`` (0.25) with a minimal config (one route to a receiver that notifies
nobody), clustering disabled (``--cluster.listen-address=``), storage and logs in a temp dir. It starts in
~0.1 s, so tests may start their own (an HA pair, one started late on a port chosen in advance).

Usage::

    with AlertmanagerProcess() as am:
        ...  # POST to am.url + "/api/v2/alerts"
        am.alerts(filter=['alertname="X"'])

Behind TLS and basic auth (Alertmanager's own ``--web.config.file``: ``tls_server_config``,
``basic_auth_users``), ``web_config`` is that file's text and ``client`` how the harness itself connects
(the TLS context trusting the server, presenting a client certificate if it asks; the Authorization header).

Facts checked against 0.25 (and relied on by the tests):

- ``GET /api/v2/alerts`` lists the alerts that are not resolved; ``active``/``silenced``/``inhibited``/
  ``unprocessed`` (default true) select by status, ``filter`` (repeatable) takes matchers like
  ``alertname="X"``. A resolved alert (``endsAt`` in the past) is left out whatever the flags:
  ``?active=false`` shows the silenced/inhibited ones, not the resolved ones.
- ``alertmanager_alerts_received_total{status="firing"|"resolved",version="v2"}`` on ``/metrics`` counts what
  was POSTed, by whether its ``endsAt`` had passed: the way to see that a resolve arrived.

Each harness dir holds ``owner.pid`` (the test process) and ``alertmanager.pid``: ``start()`` first kills the
Alertmanagers of dirs whose owner died (a crashed run) and removes those dirs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.harness.ports import free_port
from tests.harness.process import reap_stale_dirs

BINARY = "prometheus-alertmanager"
DIR_PREFIX = "watchd-am-"

CONFIG = """\
route:
  receiver: "null"
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: "null"
"""


class AlertmanagerHarnessError(RuntimeError):
    """The test Alertmanager could not be started or did not behave."""


def binary() -> str | None:
    return shutil.which(BINARY) or next(
        (p for p in ("/usr/bin/prometheus-alertmanager", "/usr/bin/alertmanager") if os.access(p, os.X_OK)),
        None,
    )


def available() -> tuple[bool, str]:
    """Whether an Alertmanager can be started here; the reason when not."""
    if binary() is None:
        return False, f"{BINARY} not found (apt-get install prometheus-alertmanager)"
    return True, ""


def _kill_alertmanager(d: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        pid = int((d / "alertmanager.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if str(d).encode() in cmdline:  # the pid was not reused by something else
            os.kill(pid, signal.SIGKILL)


def reap_stale(base: Path | None = None) -> list[Path]:
    """Kill the Alertmanagers of harness dirs whose owner is dead; remove the dirs."""
    return reap_stale_dirs(DIR_PREFIX, _kill_alertmanager, base)


class AlertmanagerProcess:
    """One Alertmanager on ``127.0.0.1:port`` (``port`` picked free unless given: give one to start it
    later than the code under test is pointed at it)."""

    def __init__(
        self,
        port: int | None = None,
        *,
        start_timeout: float = 15.0,
        web_config: str | None = None,
        client: tuple[ssl.SSLContext | None, str | None] = (None, None),
    ) -> None:
        self.port = port if port is not None else free_port()
        self.start_timeout = start_timeout
        self.web_config = web_config
        self._tls, self._authorization = client
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    @property
    def url(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def _open(self, path: str, timeout: float) -> Any:
        headers = {"Authorization": self._authorization} if self._authorization else {}
        request = urllib.request.Request(self.url + path, headers=headers)
        return urllib.request.urlopen(request, timeout=timeout, context=self._tls)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> AlertmanagerProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        exe = binary()
        if exe is None:
            raise AlertmanagerHarnessError(available()[1])
        if self.running:
            return
        reap_stale()
        self.dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
        (self.dir / "owner.pid").write_text(str(os.getpid()))
        conf = self.dir / "alertmanager.yml"
        conf.write_text(CONFIG)
        (self.dir / "data").mkdir()
        web: list[str] = []
        if self.web_config is not None:
            (self.dir / "web.yml").write_text(self.web_config)
            web = [f"--web.config.file={self.dir / 'web.yml'}"]
        self._log_file = (self.dir / "alertmanager.log").open("wb")
        self._proc = subprocess.Popen(
            [
                exe,
                f"--config.file={conf}",
                f"--storage.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=debug",
                *web,
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        (self.dir / "alertmanager.pid").write_text(str(self._proc.pid))
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._proc.poll() is not None:
                log = self.log_tail()
                self.stop()
                raise AlertmanagerHarnessError(f"alertmanager exited at start:\n{log}")
            if self._ready():
                return
            if time.monotonic() > deadline:
                log = self.log_tail()
                self.stop()
                raise AlertmanagerHarnessError(f"alertmanager not ready after {self.start_timeout}s:\n{log}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL) and remove its dir. Its alerts are gone with it."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _ready(self) -> bool:
        try:
            with self._open("/-/ready", 1) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def log_tail(self, lines: int = 30) -> str:
        if self.dir is None:
            return "(no log)"
        try:
            return "\n".join(
                (self.dir / "alertmanager.log").read_text(errors="replace").splitlines()[-lines:]
            )
        except OSError:
            return "(log not written)"

    # ---------------------------------------------------------------- API
    def _get(self, path: str) -> bytes:
        try:
            with self._open(path, 5) as resp:
                return bytes(resp.read())
        except urllib.error.HTTPError as exc:
            raise AlertmanagerHarnessError(f"GET {path}: HTTP {exc.code}: {exc.read()[:300]!r}") from exc

    def alerts(
        self,
        *,
        active: bool = True,
        silenced: bool = True,
        inhibited: bool = True,
        unprocessed: bool = True,
        filter: Sequence[str] = (),
    ) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts``: the alerts not resolved, selected by status and matchers
        (``filter=['alertname="X"', 'node=~"gpu-.*"']``). Resolved alerts are never listed."""
        query: list[tuple[str, str]] = [
            ("active", str(active).lower()),
            ("silenced", str(silenced).lower()),
            ("inhibited", str(inhibited).lower()),
            ("unprocessed", str(unprocessed).lower()),
            *(("filter", f) for f in filter),
        ]
        out: list[dict[str, Any]] = json.loads(self._get("/api/v2/alerts?" + urllib.parse.urlencode(query)))
        return out

    def alert(self, alertname: str) -> dict[str, Any] | None:
        """The one listed alert named ``alertname`` (None when none); raises when there are several."""
        found = self.alerts(filter=[f'alertname="{alertname}"'])
        if len(found) > 1:
            raise AlertmanagerHarnessError(f"{len(found)} alerts named {alertname}: {found}")
        return found[0] if found else None

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample of the Alertmanager's own ``/metrics`` (0 when absent), e.g.
        ``metric("alertmanager_alerts_received_total", {"status": "resolved", "version": "v2"})``."""
        want = labels or {}
        for line in self._get("/metrics").decode().splitlines():
            m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line)
            if m is None or m.group(1) != name:
                continue
            got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in want.items()):
                return float(m.group(3))
        return 0.0

    def received(self, status: str) -> float:
        """How many alerts with ``status`` (firing | resolved) were POSTed to API v2."""
        return self.metric("alertmanager_alerts_received_total", {"status": status, "version": "v2"})
