"""Kernel Xid message parsing: log lines in, :class:`XidRecord` out. Pure: no I/O, never raises.

One :class:`XidParser` per log stream (a file, ``/dev/kmsg``, a journal): it is stateful because three kernel
facts span lines.

* ``NVRM: GPU at PCI:0000:9b:00: GPU-<uuid>`` precedes each GPU's first Xid; the parser remembers the
  PCI -> UUID mapping (the most recent :data:`UUID_MAP_SIZE` GPUs) and attaches the UUID to later records.
* Xid 79 ("GPU has fallen off the bus") is also printed without an Xid number, on one line
  (``NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.``) or on three (``NVRM: The NVIDIA GPU 0000:b3:00.0``
  / ``NVRM: (PCI ID: 10de:26b5) installed in this system has`` / ``NVRM: fallen off the bus and is not
  responding to commands.``, the last within :data:`MULTILINE_SPAN` lines of the first). Both become Xid 79
  records, with ``pid`` and ``process`` None.
* The driver usually reports one fall-off-the-bus in several of these forms. See :meth:`XidParser.feed`
  for the de-duplication rule.

On a GPU in MIG mode the driver names the GPU instance and compute instance the Xid is attributed to
(``NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, ...``, ``NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:02): 94,
...``): they become the record's ``gpu_instance`` and ``compute_instance``.

Accepted line prefixes, stripped (repeatedly, in any combination) before the ``NVRM:`` message: syslog
(``Dec  2 10:00:01 host kernel: ``, ``2026-12-02T10:00:01.123456+00:00 host kernel: ``; also
``journalctl -k`` short, short-precise, short-iso and short-full), the kernel uptime ``[12345.678901] ``,
``dmesg -T`` (``[Wed Dec  2 10:00:01 2026] ``), ``dmesg -x`` (``kern  :warn  : ``), a printk caller id
(``[T123] ``), a bare ``kernel: ``, ``journalctl -o export`` (``MESSAGE=``), a syslog ``<4>`` priority and a
raw ``/dev/kmsg`` header (``4,1234,5678,-;``). A syslog line whose tag is not ``kernel`` is ignored: anyone
may write ``NVRM: Xid ...`` to syslog with ``logger``, only the kernel's lines count.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from watchd.xid.catalog import RECOVERY_ACTIONS
from watchd.xid.pci import normalize_pci

__all__ = [
    "DEDUP_WINDOW",
    "MULTILINE_SPAN",
    "UUID_MAP_SIZE",
    "XidParser",
    "XidRecord",
    "parse_text",
    "strip_prefix",
]

#: Lines within which repeated fall-off-the-bus reports for one GPU count as one failure.
DEDUP_WINDOW = 20
#: The three-line fall-off-the-bus message must complete within this many lines of its first line.
MULTILINE_SPAN = 5
#: How many PCI -> UUID mappings a parser remembers (least recently seen dropped first).
UUID_MAP_SIZE = 1024

XID_FALLEN_OFF_BUS = 79
XID_RECOVERY_ACTION = 154
NVLINK5_XIDS = frozenset(range(144, 151))


@dataclass(frozen=True, slots=True)
class XidRecord:
    """One Xid reported by the kernel driver for one GPU."""

    xid: int
    pci_bus_id: str  # normalized dddd:bb:dd.f
    pid: int | None
    process: str | None
    message: str  # the Xid's own text (after pid=/name=), stripped
    raw: str  # the kernel message line(s) with any log prefix removed ("\n"-joined for multi-line)
    uuid: str | None = None  # "GPU-..." when an earlier "NVRM: GPU at PCI:... GPU-<uuid>" line mapped it
    details: Mapping[str, int | str] = field(default_factory=dict)  # decoded extras (Xid 154, 144-150, ...)
    # MIG: the GPU instance (``GPU-I:05``) and compute instance (``GPU-CI:02``) the driver attributed it to
    gpu_instance: int | None = None
    compute_instance: int | None = None


# --- line prefixes --------------------------------------------------------------------------------

_MON = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_TIME = r"[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?"
_PREFIX_RE = re.compile(
    rf"""
    (?:
        MESSAGE=                                                  # journalctl -o export
      | <[0-9]{{1,3}}>                                            # syslog priority
      | [0-9]{{1,10}},[0-9]{{1,20}},[0-9]{{1,20}},[^,;\s]*(?:,[^;]*)?;   # raw /dev/kmsg header
      | (?:                                                       # syslog / journalctl timestamp, host, tag
            (?:{_DAY}\s+)?{_MON}\s+[0-9]{{1,2}}\s+{_TIME}
          | (?:{_DAY}\s+)?[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}[T\s]{_TIME}(?:Z|[+-][0-9]{{2}}:?[0-9]{{2}})?
            (?:\s+[A-Z]{{2,5}})?
        )
        \s+(?:[^\s:]+\s+)??(?P<tag>[^\s:\[\]]+)(?:\[[0-9]{{1,10}}\])?:\s
      | \[\s*[0-9]{{1,12}}\.[0-9]{{1,9}}\]                       # [12345.678901] uptime
      | \[{_DAY}\s+{_MON}\s+[0-9]{{1,2}}\s+{_TIME}\s+[0-9]{{4}}\]  # dmesg -T
      | \[\s*[TC][0-9]{{1,10}}\]                                  # printk caller id
      | kern\s*:\s*[a-z]{{1,8}}\s*:\s                             # dmesg -x
      | kernel:\s                                                 # bare "kernel: "
      | [^\s:\[\]]+\s+kernel:\s                                   # "host kernel: " (short-monotonic)
    )
    """,
    re.VERBOSE | re.ASCII,
)
_MAX_PREFIXES = 8


def strip_prefix(line: str) -> str | None:
    """The kernel message of a log line with its log prefixes removed.

    None when a syslog prefix names a tag other than ``kernel`` (not a kernel message).
    """
    s = line.strip()
    for _ in range(_MAX_PREFIXES):
        m = _PREFIX_RE.match(s)
        if m is None:
            break
        tag = m.group("tag")
        if tag is not None and tag != "kernel":
            return None
        s = s[m.end() :].lstrip()
    return s


# --- NVRM messages --------------------------------------------------------------------------------

_XID_RE = re.compile(
    r"NVRM:\s*Xid\s*\(\s*(?P<pci>[^()\s]{1,40})"
    r"(?:\s+GPU-I:\s*(?P<gi>[0-9]{1,5}))?(?:\s+GPU-CI:\s*(?P<ci>[0-9]{1,5}))?"  # MIG attribution
    r"\s*\)\s*:\s*(?P<xid>[0-9]{1,6})(?![0-9])\s*,?\s*(?P<rest>.*)",
    re.ASCII | re.DOTALL,
)
_PID_RE = re.compile(r"pid\s*=\s*(?P<pid>'<unknown>'|<unknown>|'?[0-9]{1,10}'?)(?:\s*,\s*|\s*$)", re.ASCII)
_NAME = "name="
_UUID_RE = re.compile(
    r"NVRM:\s*GPU at (?:PCI:)?(?P<pci>[0-9A-Fa-f:.]{5,20}):\s+"
    r"(?P<uuid>GPU-[0-9A-Fa-f-]{8,64})(?![0-9A-Za-z-])",
    re.ASCII,
)
_FALLEN_ONE_RE = re.compile(
    r"NVRM:\s*GPU (?:PCI:)?(?P<pci>[0-9A-Fa-f:.]{5,20}):\s+(?P<msg>GPU has fallen off the bus\b.*)",
    re.ASCII | re.DOTALL,
)
_MULTI_START_RE = re.compile(
    r"NVRM:\s*The NVIDIA GPU (?:PCI:)?(?P<pci>[0-9A-Fa-f:.]{5,20})(?:\s.*)?$", re.ASCII | re.DOTALL
)
_MULTI_PCI_ID_RE = re.compile(r"\(PCI ID:\s*(?P<id>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4})\)", re.ASCII)
_MULTI_MIDDLE_RE = re.compile(r"NVRM:\s*\(PCI ID:[^)]*\)\s*installed in this system", re.ASCII)
_MULTI_END = "fallen off the bus"

_RECOVERY_RE = re.compile(
    r"recovery action changed from 0x(?P<old>[0-9A-Fa-f]{1,8})\b.{0,100}?\bto 0x(?P<new>[0-9A-Fa-f]{1,8})\b",
    re.ASCII | re.DOTALL,
)
_NVL_UNIT_RE = re.compile(r"(?P<unit>[A-Z][A-Z0-9_]{1,63})(?![A-Za-z0-9_])", re.ASCII)
_NVL_SEVERITY_RE = re.compile(r"\b(?P<sev>fatal|non-?fatal)\b", re.ASCII | re.IGNORECASE)
_NVL_LINK_RE = re.compile(r"\bLink\s+(?P<link>[0-9]{1,3})\b", re.ASCII)
_NVL_INTR_RE = re.compile(r"[(\[]\s*(?P<intr>0x[0-9A-Fa-f]{1,16})\b", re.ASCII)


def _instance(digits: str | None) -> int | None:
    return None if digits is None else int(digits)


def _decode_pid(text: str) -> int | None:
    digits = text.strip("'")
    return int(digits) if digits.isdigit() else None


def _decode_name(text: str) -> str | None:
    name = text.strip()
    if not name or name in ("<unknown>", "'<unknown>'"):
        return None
    return name


def _split_rest(rest: str) -> tuple[int | None, str | None, str]:
    """``pid=<n>, name=<comm>, <message>`` (pid and name each optional) -> (pid, process, message)."""
    pid: int | None = None
    process: str | None = None
    m = _PID_RE.match(rest)
    if m is not None:
        pid = _decode_pid(m.group("pid"))
        rest = rest[m.end() :]
    if rest.startswith(_NAME):
        # the name ends at the first ", " (it may contain ':', '[]' and spaces); the message follows it
        end = rest.find(", ", len(_NAME))
        if end < 0:
            process, rest = _decode_name(rest[len(_NAME) :].rstrip().removesuffix(",")), ""
        else:
            process, rest = _decode_name(rest[len(_NAME) : end]), rest[end + 2 :]
    return pid, process, rest.strip()


def _details(xid: int, message: str) -> dict[str, int | str]:
    """Decode what the message of some Xids reliably carries; conservative: absent when not recognized."""
    details: dict[str, int | str] = {}
    if xid == XID_RECOVERY_ACTION:
        m = _RECOVERY_RE.search(message)
        if m is not None:
            new = int(m.group("new"), 16)
            details["recovery_action_from"] = int(m.group("old"), 16)
            details["recovery_action_to"] = new
            details["recovery_action"] = RECOVERY_ACTIONS.get(new, "UNKNOWN")
    elif xid in NVLINK5_XIDS:
        # e.g. "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 ...)"
        m = _NVL_UNIT_RE.match(message)
        if m is not None:
            details["nvlink_subcode"] = m.group("unit")
        m = _NVL_SEVERITY_RE.search(message)
        if m is not None:
            details["nvlink_severity"] = "fatal" if m.group("sev").lower() == "fatal" else "nonfatal"
        m = _NVL_LINK_RE.search(message)
        if m is not None:
            details["nvlink_link"] = int(m.group("link"))
        m = _NVL_INTR_RE.search(message)
        if m is not None:
            details["nvlink_intr_info"] = m.group("intr").lower()
    return details


@dataclass(slots=True)
class _Pending:
    """A three-line fall-off-the-bus message being assembled."""

    pci: str
    line: int
    bodies: list[str]
    pci_id: str | None


@dataclass(slots=True)
class _Chain:
    """Recent fall-off-the-bus reports for one GPU (see :meth:`XidParser.feed`)."""

    last_line: int
    credit: bool  # a number-less report was emitted and no explicit Xid 79 line has been folded into it yet


class XidParser:
    """Stateful parser for one log stream. Never raises; use one instance per stream."""

    __slots__ = ("_chains", "_line", "_pending", "_uuids")

    def __init__(self) -> None:
        self._line = 0
        self._uuids: OrderedDict[str, str] = OrderedDict()
        self._pending: _Pending | None = None
        self._chains: dict[str, _Chain] = {}

    def feed(self, line: str) -> list[XidRecord]:
        """One log line in (a trailing newline is ignored; embedded newlines split it into several lines,
        as in a ``/dev/kmsg`` record), zero or more records out.

        Fall-off-the-bus de-duplication, per PCI address. The reports of one failure form a *chain*: each
        report (explicit ``Xid ...: 79`` line, single-line or completed three-line number-less message) within
        :data:`DEDUP_WINDOW` lines of the previous report for the same address extends it; a report farther
        away starts a new chain. In a chain:

        * every explicit ``Xid ...: 79`` line is emitted, except the first one after a number-less report
          that opened the chain (that number-less record already stands for it);
        * a number-less report is emitted only when it opens the chain.

        So "explicit, then number-less" and "number-less, then explicit" each give one record, and two
        explicit Xid 79 lines always give two.
        """
        line = line.rstrip("\r\n")
        if "\n" not in line:
            return self._feed_one(line)
        out: list[XidRecord] = []
        for part in line.split("\n"):
            out.extend(self._feed_one(part))
        return out

    # -- internals --------------------------------------------------------------------------------

    def _feed_one(self, line: str) -> list[XidRecord]:
        self._line += 1
        if "NVRM" not in line:
            return []
        body = strip_prefix(line)
        if body is None or not body.startswith("NVRM:"):
            return []
        pending = self._pending
        if pending is not None and self._line - pending.line >= MULTILINE_SPAN:
            self._pending = pending = None

        m = _XID_RE.match(body)
        if m is not None:
            return self._on_xid(m, body)
        m = _UUID_RE.match(body)
        if m is not None:
            pci = normalize_pci(m.group("pci"))
            if pci is not None:
                self._remember_uuid(pci, m.group("uuid"))
            return []
        m = _FALLEN_ONE_RE.match(body)
        if m is not None:
            pci = normalize_pci(m.group("pci"))
            if pci is None:
                return []
            return self._on_numberless(pci, m.group("msg").strip(), body, {})
        m = _MULTI_START_RE.match(body)
        if m is not None:
            pci = normalize_pci(m.group("pci"))
            if pci is not None:
                idm = _MULTI_PCI_ID_RE.search(body)
                self._pending = _Pending(pci, self._line, [body], idm.group("id").lower() if idm else None)
            return []
        if pending is None:
            return []
        if _MULTI_END in body:
            self._pending = None
            bodies = [*pending.bodies, body]
            message = " ".join(b[len("NVRM:") :].strip() for b in bodies)
            details: dict[str, int | str] = {}
            if pending.pci_id is not None:
                details["pci_device_id"] = pending.pci_id
            return self._on_numberless(pending.pci, message, "\n".join(bodies), details)
        if _MULTI_MIDDLE_RE.match(body) and len(pending.bodies) < 2:
            pending.bodies.append(body)
            idm = _MULTI_PCI_ID_RE.search(body)
            if idm is not None:
                pending.pci_id = idm.group("id").lower()
        return []

    def _on_xid(self, m: re.Match[str], body: str) -> list[XidRecord]:
        pci = normalize_pci(m.group("pci"))
        if pci is None:
            return []
        xid = int(m.group("xid"))
        pid, process, message = _split_rest(m.group("rest"))
        if xid == XID_FALLEN_OFF_BUS and not self._explicit79_wanted(pci):
            return []
        rec = XidRecord(
            xid=xid,
            pci_bus_id=pci,
            pid=pid,
            process=process,
            message=message,
            raw=body,
            uuid=self._uuid(pci),
            details=_details(xid, message),
            gpu_instance=_instance(m.group("gi")),
            compute_instance=_instance(m.group("ci")),
        )
        return [rec]

    def _on_numberless(
        self, pci: str, message: str, raw: str, details: dict[str, int | str]
    ) -> list[XidRecord]:
        chain = self._chain(pci)
        if chain is not None:
            chain.last_line = self._line
            return []
        self._chains[pci] = _Chain(self._line, credit=True)
        rec = XidRecord(
            xid=XID_FALLEN_OFF_BUS,
            pci_bus_id=pci,
            pid=None,
            process=None,
            message=message,
            raw=raw,
            uuid=self._uuid(pci),
            details=details,
        )
        return [rec]

    def _explicit79_wanted(self, pci: str) -> bool:
        chain = self._chain(pci)
        if chain is None:
            self._chains[pci] = _Chain(self._line, credit=False)
            return True
        chain.last_line = self._line
        if chain.credit:
            chain.credit = False
            return False
        return True

    def _chain(self, pci: str) -> _Chain | None:
        """The live chain for ``pci``, or None (forgetting expired chains when many pile up)."""
        if len(self._chains) > 64:
            self._chains = {k: c for k, c in self._chains.items() if self._line - c.last_line <= DEDUP_WINDOW}
        chain = self._chains.get(pci)
        if chain is None or self._line - chain.last_line > DEDUP_WINDOW:
            return None
        return chain

    def _remember_uuid(self, pci: str, uuid: str) -> None:
        self._uuids[pci] = uuid
        self._uuids.move_to_end(pci)
        while len(self._uuids) > UUID_MAP_SIZE:
            self._uuids.popitem(last=False)

    def _uuid(self, pci: str) -> str | None:
        return self._uuids.get(pci)


def parse_text(lines: Iterable[str]) -> Iterator[XidRecord]:
    """All Xid records in ``lines``, read as one log stream."""
    parser = XidParser()
    for line in lines:
        yield from parser.feed(line)
