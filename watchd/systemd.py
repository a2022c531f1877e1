"""sd_notify without a dependency: READY=1, STOPPING=1 and watchdog pings for Type=notify units."""

from __future__ import annotations

import asyncio
import os
import socket


def notify(message: str) -> bool:
    """Send one notification to systemd; False when not run under a notify socket."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(address)
            sock.sendall(message.encode())
        except OSError:
            return False
    return True


def watchdog_interval() -> float | None:
    """Half of WATCHDOG_USEC in seconds when systemd asked for pings for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None


async def watchdog_pinger() -> None:
    """Ping systemd's watchdog while the event loop is alive; returns at once when not asked to."""
    interval = watchdog_interval()
    if interval is None:
        return
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
