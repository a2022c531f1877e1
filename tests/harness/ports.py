"""Free TCP ports on loopback for the daemons a test starts.

A port is free when the kernel hands it out for ``bind(0)``, but once that socket is closed the next
``bind(0)`` may hand out the same one: two listeners of one daemon's config (an agent's API and its heartbeat
port) then collide and the daemon exits with "address already in use". This process remembers the ports it
handed out lately and never gives one out twice among them."""

from __future__ import annotations

import socket
from collections import deque

#: ports handed out lately, never handed out again while remembered
_RECENT: deque[int] = deque(maxlen=4096)
_RECENT_SET: set[int] = set()


def free_port() -> int:
    """A port on 127.0.0.1 free now and not handed out lately by this process."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _RECENT_SET:
            break
    else:
        raise RuntimeError("no free port on 127.0.0.1 that was not handed out lately")
    if len(_RECENT) == _RECENT.maxlen:
        _RECENT_SET.discard(_RECENT[0])
    _RECENT.append(port)
    _RECENT_SET.add(port)
    return port


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports."""
    return [free_port() for _ in range(n)]
