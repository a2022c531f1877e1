"""Issue 16 item 11: slow clients. Connections that trickle their headers (no token needed) or their body must
be cut by read timeouts, and the number held at once capped, on the engine and on the agent's heartbeat port.
Measured from outside: the daemon's open descriptors (/proc/PID/fd) while 150 clients trickle one byte every
half second."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.daemons import Daemon, agent_config
from tests.fault.common import start_engine

pytestmark = pytest.mark.real

CLIENTS = 150
WAIT_S = 5.0


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Daemon]]:
    tmp = tmp_path_factory.mktemp("slow")
    engine = start_engine(tmp, mode="dry-run")
    log = tmp / "kern.log"
    log.write_text("")
    agent = Daemon("agent", agent_config("gpu-1", engine.port, tmp / "token", log), tmp)
    try:
        agent.wait_ready()
        yield engine, agent
    finally:
        agent.stop()
        engine.stop()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _trickle(port: int, path: str, stop: threading.Event) -> None:
    socks: list[socket.socket] = []
    try:
        for i in range(CLIENTS):
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            if i % 2:
                s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())  # headers never end
            else:
                s.sendall(
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Content-Length: 100000\r\n\r\n{".encode()
                )  # body never ends
            socks.append(s)
        while not stop.wait(0.5):
            for s in list(socks):
                try:
                    s.send(b" ")
                except OSError:
                    socks.remove(s)
    finally:
        for s in socks:
            s.close()


def _check(daemon: Daemon, port: int, path: str) -> None:
    pid = daemon.proc.pid
    baseline = _fds(pid)
    stop = threading.Event()
    t = threading.Thread(target=_trickle, args=(port, path, stop), daemon=True)
    t.start()
    try:
        time.sleep(1.0)
        peak = _fds(pid)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and _fds(pid) > baseline + 10:
            peak = max(peak, _fds(pid))
            time.sleep(0.25)
        held = _fds(pid) - baseline
    finally:
        stop.set()
        t.join(10)
    assert held <= 10, (
        f"{held} trickling connections still held after {WAIT_S + 1:.0f}s (peak {peak - baseline} "
        "descriptors over the baseline): no header/body read timeout"
    )


def test_engine_cuts_slow_clients(daemons: tuple[Daemon, Daemon]) -> None:
    engine, _ = daemons
    _check(engine, engine.port, "/api/v1/events")


def test_agent_heartbeat_port_cuts_slow_clients(daemons: tuple[Daemon, Daemon]) -> None:
    _, agent = daemons
    port = int(yaml.safe_load(Path(agent.config_path).read_text())["heartbeat"]["http_port"])
    _check(agent, port, "/v1/heartbeat")
