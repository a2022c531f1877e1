"""PCI address normalization: one canonical form to join kernel, NVML and exporter views of a GPU.

The kernel prints ``PCI:0000:9b:00`` or ``0000:9b:00`` (no function) in Xid lines and ``0000:9b:00.0``
elsewhere; NVML's ``busId`` is ``00000000:9B:00.0`` (8-digit domain, upper case); dcgm-exporter labels follow
NVML. All of them normalize to ``dddd:bb:dd.f`` in lower case, the form Linux itself uses in sysfs.
"""

from __future__ import annotations

import functools
import re

__all__ = ["normalize_pci", "short_pci"]

# [domain:]bus:device[.function]; the domain is 4 to 8 hex digits (Linux prints at least 4, NVML 8, VMD
# domains have 5), bus and device are 2 hex digits, the function one octal digit.
_PCI_RE = re.compile(
    r"(?:pci:)?(?:(?P<domain>[0-9a-f]{4,8}):)?(?P<bus>[0-9a-f]{2}):(?P<dev>[0-9a-f]{2})(?:\.(?P<fn>[0-7]))?",
    re.IGNORECASE | re.ASCII,
)

_MAX_DEVICE = 0x1F


@functools.lru_cache(maxsize=4096)  # a fleet has a few dozen addresses; the engine reads one per summary
def normalize_pci(text: str) -> str | None:
    """Normalize a PCI address to ``dddd:bb:dd.f`` (lower case), or None when ``text`` is not one.

    Accepts an optional ``PCI:`` prefix (any case), a domain of 4 to 8 hex digits (``00000000`` -> ``0000``;
    a domain above ``ffff`` keeps its digits, as Linux prints it), no domain at all (domain 0 is assumed), and
    no function (``.0`` is assumed). Surrounding whitespace is ignored; anything else is garbage.

    >>> normalize_pci("PCI:0000:9B:00")
    '0000:9b:00.0'
    >>> normalize_pci("00000000:9B:00.0")
    '0000:9b:00.0'
    """
    m = _PCI_RE.fullmatch(text.strip())
    if m is None:
        return None
    domain = int(m.group("domain") or "0", 16)
    bus = int(m.group("bus"), 16)
    dev = int(m.group("dev"), 16)
    fn = int(m.group("fn") or "0")
    if dev > _MAX_DEVICE:
        return None
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def short_pci(text: object) -> str:
    """A GPU's PCI address in as few characters as tell it from the node's other GPUs, for a drain reason
    that ``sinfo -R`` shows 20 characters of: ``bb:dd`` (``0000:3b:00.0`` -> ``3b:00``); a non-zero domain
    stays, without its leading zeros (``0009:01:00.0`` -> ``9:01:00``: GPUs of one node may differ by domain
    alone), and so does a function other than 0. Anything that is not a PCI address is returned as it is.

    >>> short_pci("0000:3b:00.0"), short_pci("0009:01:00.0"), short_pci("?")
    ('3b:00', '9:01:00', '?')
    """
    norm = normalize_pci(str(text))
    if norm is None:
        return str(text)
    domain, bus, rest = norm.split(":")
    dev, fn = rest.split(".")
    short = f"{bus}:{dev}" if fn == "0" else f"{bus}:{dev}.{fn}"
    return short if int(domain, 16) == 0 else f"{int(domain, 16):x}:{short}"
