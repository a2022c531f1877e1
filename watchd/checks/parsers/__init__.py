"""Parsers of what check tools print (pure: text in, a report out; never raise on bad input)."""

from watchd.checks.parsers.dcgm import DcgmReport, DcgmTest, parse_dcgm
from watchd.checks.parsers.nccl import NcclReport, NcclRow, parse_nccl

__all__ = ["DcgmReport", "DcgmTest", "NcclReport", "NcclRow", "parse_dcgm", "parse_nccl"]
