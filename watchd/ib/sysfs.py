"""What the files of ``/sys/class/infiniband/<device>/ports/<port>/`` say, parsed. Pure: text in, values out.

The formats are the kernel's (drivers/infiniband/core/sysfs.c): ``state`` is ``"%d: %s"`` (``4: ACTIVE``),
``phys_state`` ``"%d: %s"`` (``5: LinkUp``), ``rate`` ``"%d%s Gb/sec (%dX%s)"`` (``400 Gb/sec (4X NDR)``,
``2.5 Gb/sec (1X SDR)``; older kernels leave the speed name out: ``10 Gb/sec (4X)``), ``link_layer``
``InfiniBand``, ``Ethernet`` or ``Unknown``, and a counter ``"%u"`` or, for a device without a performance
management agent, ``N/A (no PMA)``. Only the number of a state is trusted: its name is the kernel's table,
and a recorded tree may say otherwise (prometheus/procfs's mlx5 fixture has ``phys_state`` ``4: ACTIVE``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from watchd.model.ib import PHYS_STATES, PORT_STATES

__all__ = ["PortReading", "Rate", "Snapshot", "parse_counter", "parse_rate", "parse_state"]

_STATE = re.compile(r"\s*(\d{1,3})\s*(?::\s*(.*?))?\s*$", re.S)
_RATE = re.compile(
    r"\s*(\d{1,6}(?:\.\d{1,6})?)\s*Gb/sec(?:\s*\((\d{1,2})X(?:\s*([A-Za-z0-9]{1,16}))?\))?", re.S
)
_COUNTER = re.compile(r"\s*(\d{1,20})\s*$")
_U64 = 2**64 - 1


def parse_state(text: str | None, names: Mapping[int, str]) -> tuple[int, str] | None:
    """``"4: ACTIVE"`` -> (4, "ACTIVE"): the number and the kernel's name for it (the text's when unknown)."""
    if text is None:
        return None
    m = _STATE.match(text)
    if m is None:
        return None
    number = int(m.group(1))
    return number, names.get(number) or (m.group(2) or "").strip()[:32] or str(number)


@dataclass(frozen=True, slots=True)
class Rate:
    gbps: float
    width: int | None  # lanes: 1, 2, 4, 8, 12
    speed: str | None  # SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR


def parse_rate(text: str | None) -> Rate | None:
    """``"400 Gb/sec (4X NDR)"`` -> Rate(400.0, 4, "NDR")."""
    if text is None:
        return None
    m = _RATE.match(text)
    if m is None:
        return None
    width = m.group(2)
    return Rate(float(m.group(1)), int(width) if width else None, m.group(3))


def parse_counter(text: str | None) -> int | None:
    """A counter's value; None for ``N/A (no PMA)``, an empty file or anything not an unsigned integer."""
    if text is None:
        return None
    m = _COUNTER.match(text)
    if m is None:
        return None
    value = int(m.group(1))
    return value if value <= _U64 else None


@dataclass(frozen=True, slots=True)
class PortReading:
    """One port as one scan read it; a field is None when its file was missing, unreadable or unparsable."""

    device: str
    port: int
    state: int | None = None
    phys_state: int | None = None
    rate: Rate | None = None
    link_layer: str | None = None
    hca_type: str | None = None
    counters: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    hw_counters: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    #: files that exist but could not be read (EIO, EACCES, a driver that returns an error), by name
    unreadable: tuple[str, ...] = ()
    #: counters that read ``N/A (no PMA)`` or some other text that is not a number
    unsupported: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def state_name(self) -> str | None:
        return None if self.state is None else PORT_STATES.get(self.state, str(self.state))

    @property
    def phys_name(self) -> str | None:
        return None if self.phys_state is None else PHYS_STATES.get(self.phys_state, str(self.phys_state))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every watched port of the node at one time. ``present``: the class folder exists (a node without an
    RDMA driver has none); ``skipped``: devices or ports left out by the bounds."""

    time: float
    ports: tuple[PortReading, ...] = ()
    present: bool = True
    skipped: int = 0
