"""Decoding NVIDIA Xid errors from kernel log text: parser, catalog and PCI address normalization."""

from watchd.xid.catalog import RECOVERY_ACTIONS, XidInfo, lookup
from watchd.xid.parser import XidParser, XidRecord, parse_text
from watchd.xid.pci import normalize_pci

__all__ = [
    "RECOVERY_ACTIONS",
    "XidInfo",
    "XidParser",
    "XidRecord",
    "lookup",
    "normalize_pci",
    "parse_text",
]
