"""Read a node's InfiniBand/RoCE ports from sysfs into a :class:`~watchd.ib.sysfs.Snapshot` (blocking: the
agent runs it in a worker thread).

Bounded: at most ``max_devices`` devices (by name, of those ``devices`` matches) and ``max_ports`` ports in
all; per port, its four state files and the counters asked for, and no more (on a real HCA each
``counters/`` file is a performance-management query to the firmware). Which counters a port has is listed
once, when the port is first seen (again if its device goes and comes back); a device's ``hca_type`` is read
then too. Each file is one ``open``/``read``/``close``; a file that cannot be read (EIO, EACCES, a driver that
answers an error, the device leaving mid-scan) leaves its value None and is named in the reading.
"""

from __future__ import annotations

import errno
import fnmatch
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from watchd.ib.sysfs import PortReading, Snapshot, parse_counter, parse_rate, parse_state
from watchd.model.ib import COUNTER_WIDTHS, PHYS_STATES, PORT_STATES

__all__ = ["SysfsReader"]

_READ = 256  # every file read is a line of text


class _Unreadable(Exception):
    pass


_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_DIR = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY


def _read(path: str, dir_fd: int | None = None) -> str | None:
    """The file's text (``path`` relative to ``dir_fd`` when given); None when it does not exist;
    :class:`_Unreadable` when it exists but cannot be read."""
    try:
        fd = os.open(path, _FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _Unreadable(errno.errorcode.get(exc.errno or 0, str(exc.errno))) from None
    try:
        return os.read(fd, _READ).decode("ascii", "replace")
    except OSError as exc:
        raise _Unreadable(errno.errorcode.get(exc.errno or 0, str(exc.errno))) from None
    finally:
        os.close(fd)


def _names(folder: str, limit: int = 1024) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            return sorted(e.name for _, e in zip(range(limit), entries, strict=False))
    except OSError:
        return []


@dataclass(frozen=True, slots=True)
class _Layout:
    """What one port has, learned when it was first seen."""

    base: str
    hca_type: str | None
    counters: tuple[str, ...]
    hw_counters: tuple[str, ...]


class SysfsReader:
    def __init__(
        self,
        root: Path = Path("/sys/class/infiniband"),
        *,
        counters: Iterable[str] = tuple(COUNTER_WIDTHS),
        hw_counters: Iterable[str] = (),
        devices: Sequence[str] = ("*",),
        max_devices: int = 32,
        max_ports: int = 64,
        on_unreadable: Callable[[str, str], None] | None = None,
    ) -> None:
        """``on_unreadable(path, reason)``: each file that exists but could not be read, every time."""
        self.root = str(root)
        self.counters = tuple(counters)
        self.hw_counters = tuple(hw_counters)
        self.devices = tuple(devices)
        self.max_devices = max_devices
        self.max_ports = max_ports
        self._on_unreadable = on_unreadable or (lambda path, reason: None)
        self._layouts: dict[tuple[str, str], _Layout] = {}

    def _layout(self, device: str, port: str) -> _Layout:
        key = (device, port)
        layout = self._layouts.get(key)
        if layout is None:
            base = f"{self.root}/{device}/ports/{port}"
            try:
                hca = _read(f"{self.root}/{device}/hca_type")
            except _Unreadable:
                hca = None
            have = set(_names(f"{base}/counters"))
            have_hw = set(_names(f"{base}/hw_counters"))
            layout = self._layouts[key] = _Layout(
                base,
                hca.strip()[:64] or None if hca else None,
                tuple(c for c in self.counters if c in have),
                tuple(c for c in self.hw_counters if c in have_hw),
            )
        return layout

    def scan(self, now: float) -> Snapshot:
        """Every watched port now."""
        if not os.path.isdir(self.root):
            self._layouts.clear()
            return Snapshot(now, (), present=False)
        devices = [d for d in _names(self.root) if any(fnmatch.fnmatchcase(d, p) for p in self.devices)]
        skipped = max(0, len(devices) - self.max_devices)
        ports: list[PortReading] = []
        seen: set[tuple[str, str]] = set()
        for device in devices[: self.max_devices]:
            numbers = sorted((n for n in _names(f"{self.root}/{device}/ports") if n.isdigit()), key=int)
            for port in numbers:
                if len(ports) >= self.max_ports:
                    skipped += 1
                    continue
                seen.add((device, port))
                ports.append(self._port(device, port))
        for key in self._layouts.keys() - seen:  # gone: its layout is learned again if it comes back
            del self._layouts[key]
        return Snapshot(now, tuple(ports), present=True, skipped=skipped)

    def _port(self, device: str, port: str) -> PortReading:
        """The port's files, each opened relative to its folder (the folder's path, through the class
        folder's links, is resolved once a port, not once a file)."""
        layout = self._layout(device, port)
        base = layout.base
        unreadable: list[str] = []
        unsupported: list[str] = []
        try:
            port_fd = os.open(base, _DIR)
        except OSError:  # the device left between the listing and now: nothing known of it this scan
            return PortReading(device, int(port), hca_type=layout.hca_type)

        def text(name: str, dir_fd: int = port_fd, folder: str = "") -> str | None:
            try:
                return _read(name, dir_fd)
            except _Unreadable as exc:
                unreadable.append(folder + name)
                self._on_unreadable(f"{base}/{folder}{name}", str(exc))
                return None

        def numbers(folder: str, names: tuple[str, ...]) -> MappingProxyType[str, int]:
            out: dict[str, int] = {}
            if not names:
                return MappingProxyType(out)
            try:
                dir_fd = os.open(folder, _DIR, dir_fd=port_fd)
            except OSError:
                return MappingProxyType(out)
            try:
                for name in names:
                    raw = text(name, dir_fd, f"{folder}/")
                    value = parse_counter(raw)
                    if value is not None:
                        out[name] = value
                    elif raw is not None:
                        unsupported.append(f"{folder}/{name}")
            finally:
                os.close(dir_fd)
            return MappingProxyType(out)

        try:
            state = parse_state(text("state"), PORT_STATES)
            phys = parse_state(text("phys_state"), PHYS_STATES)
            rate = parse_rate(text("rate"))
            link_layer = text("link_layer")
            counters = numbers("counters", layout.counters)
            hw_counters = numbers("hw_counters", layout.hw_counters)
        finally:
            os.close(port_fd)
        return PortReading(
            device=device,
            port=int(port),
            state=state[0] if state else None,
            phys_state=phys[0] if phys else None,
            rate=rate,
            link_layer=link_layer.strip()[:32] or None if link_layer else None,
            hca_type=layout.hca_type,
            counters=counters,
            hw_counters=hw_counters,
            unreadable=tuple(unreadable),
            unsupported=tuple(unsupported),
        )
