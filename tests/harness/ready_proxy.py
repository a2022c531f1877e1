"""The one address the agents of an HA pair ship to (docs/ha.md, "Bare metal"): a TCP proxy on loopback that
sends each connection to the engine answering ``/readyz`` 200, as HAProxy with ``option httpchk GET /readyz``
(``inter`` :data:`CHECK_S`, ``fall 1 rise 1``) and ``on-marked-down shutdown-sessions`` does. With no engine
ready it answers 503 (as HAProxy: "no server is available") and the agent keeps what it had and asks again.

The agent takes one engine URL; this stands in for the load balancer the product asks for in front of two
engines, so an agent test reaches whichever engine leads through the same code path as in production."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from collections.abc import Sequence

from tests.harness.ports import free_port

#: seconds between two health checks of each engine
CHECK_S = 0.2
_BODY = b"no server is available\n"
_NO_SERVER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    + f"Content-Length: {len(_BODY)}\r\nConnection: close\r\n\r\n".encode()
    + _BODY
)


def _ready(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    for s in (src, dst):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


class ReadyProxy:
    """``url``: where the agents ship; the connections go to the first of ``ports`` (engines on loopback)
    that answers ``/readyz`` 200 at the last check."""

    def __init__(self, ports: Sequence[int]) -> None:
        self.ports = list(ports)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        #: the engine the connections go to now; None: no engine ready
        self.target: int | None = None
        #: the engines the proxy sent connections to, in turn (a failover appends the new leader)
        self.targets: list[int] = []
        self._open: dict[int, list[socket.socket]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._threads = [
            threading.Thread(target=self._check, daemon=True),
            threading.Thread(target=self._accept, daemon=True),
        ]

    def __enter__(self) -> ReadyProxy:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()
        self._shut_down_sessions(None)
        for t in self._threads:
            t.join(5)

    def _check(self) -> None:
        while not self._stop.is_set():
            ready = next((p for p in self.ports if _ready(p)), None)
            with self._lock:
                changed, self.target = ready != self.target, ready
                if changed and ready is not None:
                    self.targets.append(ready)
            if changed:
                self._shut_down_sessions(ready)
            self._stop.wait(CHECK_S)

    def _shut_down_sessions(self, keep: int | None) -> None:
        """Close the connections to every engine but ``keep`` (on-marked-down shutdown-sessions)."""
        with self._lock:
            doomed = [s for port, socks in self._open.items() if port != keep for s in socks]
            self._open = {port: socks for port, socks in self._open.items() if port == keep}
        for s in doomed:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            target = self.target
        backend: socket.socket | None = None
        if target is not None:
            with contextlib.suppress(OSError):
                backend = socket.create_connection(("127.0.0.1", target), timeout=2.0)
                backend.settimeout(None)
        if backend is None:
            with contextlib.suppress(OSError):
                client.sendall(_NO_SERVER)
            client.close()
            return
        assert target is not None
        with self._lock:
            self._open.setdefault(target, []).extend((client, backend))
        there = threading.Thread(target=_pump, args=(client, backend), daemon=True)
        there.start()
        _pump(backend, client)
        there.join()
        with self._lock:
            socks = self._open.get(target, [])
            for s in (client, backend):
                if s in socks:
                    socks.remove(s)
        client.close()
        backend.close()
