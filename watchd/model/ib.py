"""The ``ib_port_health`` kind: a condition of one InfiniBand or RoCE port (``/sys/class/infiniband/<device>/
ports/<port>/``) starts, holds or clears; and the table of what the port's files and counters mean.

Conditions (:data:`CONDITIONS`), each hardware evidence for the detectors (the port, its cable or transceiver,
or the HCA: a hang's culprit):

* ``port_down``: a port seen ACTIVE (or listed as expected) is no longer ACTIVE, or its device is gone;
* ``rate_downtrained``: an ACTIVE port runs below its reference rate (configured, else the fastest the port
  itself or a port of the same HCA type and link layer on the node ran at);
* ``link_errors``: one link-integrity counter (``counter``) rose by at least its threshold within the
  window.

Like ``gpu_health``: an event when a condition starts, again every report interval while it holds, and once
with ``value`` 0 when it clears. The agent's judge: :mod:`watchd.ib.judge`.

Counter widths are the kernel's (drivers/infiniband/core/sysfs.c, ``PORT_PMA_ATTR``: the PortCounters
attribute of the InfiniBand specification's performance management): they saturate at all ones and do not
wrap; ``counters_ext`` and ``hw_counters`` are 64-bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from watchd.model.events import Scalar
from watchd.model.kinds import Attrs

__all__ = [
    "ACTIVE_STATES",
    "CONDITIONS",
    "COUNTER_WIDTHS",
    "DEFAULT_ERROR_THRESHOLDS",
    "KIND",
    "LINK_COUNTERS",
    "PHYS_STATES",
    "PORT_STATES",
    "SOURCE",
    "IbPortHealth",
]

KIND = "ib_port_health"
SOURCE = "ib-sysfs"

PORT_DOWN = "port_down"
RATE_DOWNTRAINED = "rate_downtrained"
LINK_ERRORS = "link_errors"
CONDITIONS: tuple[str, ...] = (PORT_DOWN, RATE_DOWNTRAINED, LINK_ERRORS)

#: ``state`` as the kernel prints it (``4: ACTIVE``): enum ib_port_state.
PORT_STATES: Mapping[int, str] = MappingProxyType(
    {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
)
ACTIVE_STATES = frozenset({4, 5})
#: ``phys_state`` (``5: LinkUp``): enum ib_port_phys_state.
PHYS_STATES: Mapping[int, str] = MappingProxyType(
    {
        1: "Sleep",
        2: "Polling",
        3: "Disabled",
        4: "PortConfigurationTraining",
        5: "LinkUp",
        6: "LinkErrorRecovery",
        7: "Phy Test",
    }
)

#: ``counters/`` files and their width in bits (PortCounters; kernel ``PORT_PMA_ATTR``). The data and packet
#: counters are 64-bit where the HCA has the extended counters (the kernel then serves those under the same
#: names); the agent reads the error counters only.
COUNTER_WIDTHS: Mapping[str, int] = MappingProxyType(
    {
        "symbol_error": 16,
        "link_error_recovery": 8,
        "link_downed": 8,
        "port_rcv_errors": 16,
        "port_rcv_remote_physical_errors": 16,
        "port_rcv_switch_relay_errors": 16,
        "port_xmit_discards": 16,
        "port_xmit_constraint_errors": 8,
        "port_rcv_constraint_errors": 8,
        "local_link_integrity_errors": 4,
        "excessive_buffer_overrun_errors": 4,
        "VL15_dropped": 16,
    }
)

#: The counters of the link itself (the physical layer and the link layer of this port), in order of
#: severity: what the InfiniBand specification counts at the physical layer (SymbolErrorCounter,
#: LinkErrorRecoveryCounter, LinkDownedCounter), the receive errors of this port (local physical errors,
#: malformed packets), and the two 4-bit counters that count thresholds crossed (LocalLinkIntegrityErrors,
#: ExcessiveBufferOverrunErrors). Not link evidence: ``port_rcv_remote_physical_errors`` (a packet marked
#: bad upstream: another link's fault), ``port_xmit_discards`` and ``port_xmit_wait`` (congestion), the
#: constraint and relay errors (partitioning, switches), ``VL15_dropped`` (subnet management); nor the
#: ``hw_counters`` (transport retries and timeouts: as often the peer's or the fabric's as this port's).
LINK_COUNTERS: tuple[str, ...] = (
    "link_downed",
    "excessive_buffer_overrun_errors",
    "local_link_integrity_errors",
    "link_error_recovery",
    "port_rcv_errors",
    "symbol_error",
)

#: Increase within the window (``sources.ib.error_window_s``, 300 s) from which ``link_errors`` starts.
#: ``link_downed``, ``local_link_integrity_errors``, ``excessive_buffer_overrun_errors``: any (each is
#: fatal to a running job: NVSentinel's link counter design, which cites HPE and IBM);
#: ``link_error_recovery``: 5, one retrain a minute (a healthy link has none; each stalls traffic for
#: milliseconds); ``symbol_error`` and ``port_rcv_errors``: 3000, 10 a second (NVSentinel's rate: HDR
#: and NDR links run PAM4, whose raw bit errors are constant and expected; the IBTA's 1e-12 BER, 120 an
#: hour, is the bar for NRZ links up to EDR: set it lower there).
DEFAULT_ERROR_THRESHOLDS: Mapping[str, int] = MappingProxyType(
    {
        "link_downed": 1,
        "excessive_buffer_overrun_errors": 1,
        "local_link_integrity_errors": 1,
        "link_error_recovery": 5,
        "port_rcv_errors": 3000,
        "symbol_error": 3000,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class IbPortHealth(Attrs):
    """One report of one condition of one port (for ``link_errors``, of one counter)."""

    KIND: ClassVar[str] = KIND

    condition: str  # port_down | rate_downtrained | link_errors
    device: str  # mlx5_0 (the name NCCL prints in NET/IB lines)
    port: int
    value: int | float  # 0: cleared; port_down 1; rate_downtrained: the rate (Gb/s); link_errors: the rise
    threshold: int | float | None = None  # the reference rate, or the counter's threshold
    evidence: str | None = None  # one readable line
    link_layer: str | None = None  # InfiniBand | Ethernet (RoCE)
    state: str | None = None  # ACTIVE, DOWN, INIT, ARMED, ... or "missing" (the device is gone)
    phys_state: str | None = None  # LinkUp, Disabled, Polling, ... or "missing"
    rate_gbps: float | None = None  # while ACTIVE
    reference: str | None = None  # rate_downtrained: expected | port_max | peers
    counter: str | None = None  # link_errors: the counter (symbol_error, link_downed, ...)
    count: int | None = None  # link_errors: the counter's value now
    saturated: bool | None = None  # link_errors: the counter stopped at its maximum (it no longer counts)
    hca_type: str | None = None  # MT4129, ...
    extra: Mapping[str, Scalar] = field(default_factory=dict)
