from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchd.sources.kmsg_record import KmsgRecord, SeqTracker, parse_kmsg_record
from watchd.xid import XidParser


def test_plain_record() -> None:
    rec = parse_kmsg_record(b"6,339,5140900,-;NET: Registered protocol family 10\n")
    assert rec == KmsgRecord(
        priority=6,
        facility=0,
        seq=339,
        usec=5140900,
        flags="-",
        message="NET: Registered protocol family 10",
        fields={},
    )


def test_priority_encodes_facility_and_level() -> None:
    rec = parse_kmsg_record(b"12,1,2,-;user message\n")  # facility 1 (user) << 3 | level 4 (warning)
    assert rec is not None
    assert (rec.facility, rec.priority) == (1, 4)
    rec = parse_kmsg_record(b"3,1,2,-;x\n")
    assert rec is not None
    assert (rec.facility, rec.priority) == (0, 3)


def test_continuation_lines() -> None:
    data = (
        b"4,4711,123456789,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, "
        b"GPU has fallen off the bus.\n"
        b" SUBSYSTEM=pci\n"
        b" DEVICE=+pci:0000:3b:00.0\n"
    )
    rec = parse_kmsg_record(data)
    assert rec is not None
    assert rec.seq == 4711
    assert rec.usec == 123456789
    assert rec.message.endswith("GPU has fallen off the bus.")
    assert rec.fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}


def test_extra_header_fields_and_flags() -> None:
    rec = parse_kmsg_record(b"4,10,20,c,caller=T812;first part\n")
    assert rec is not None
    assert (rec.flags, rec.message) == ("c", "first part")


def test_no_trailing_newline() -> None:
    rec = parse_kmsg_record(b"6,1,2,-;hello")
    assert rec is not None
    assert rec.message == "hello"


def test_escapes() -> None:
    data = (
        b"3,5,6,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this "
        b"system has\\x0aNVRM: fallen off the bus and is not responding to commands.\\x0a\n"
    )
    rec = parse_kmsg_record(data)
    assert rec is not None
    assert rec.message.split("\n") == [
        "NVRM: The NVIDIA GPU 0000:b3:00.0",
        "NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
        "",
    ]
    # the reader hands the message to the Xid parser as one record
    [xid] = XidParser().feed(rec.message)
    assert (xid.xid, xid.pci_bus_id) == (79, "0000:b3:00.0")


@pytest.mark.parametrize(
    ("escaped", "text"),
    [
        (b"caf\\xc3\\xa9", "café"),  # escaped UTF-8 bytes come back as one character
        (b"back\\x5cslash", "back\\slash"),
        (b"tab\\x09here", "tab\there"),
        (b"bad \\xff byte", "bad \ufffd byte"),
        (b"not an escape \\xZZ", "not an escape \\xZZ"),
        (b"raw \xc3\xa9", "raw é"),
    ],
)
def test_unescape(escaped: bytes, text: str) -> None:
    rec = parse_kmsg_record(b"6,1,2,-;" + escaped + b"\n KEY=" + escaped + b"\n")
    assert rec is not None
    assert rec.message == text
    assert rec.fields == {"KEY": text}


def test_bad_continuation_lines_are_skipped() -> None:
    rec = parse_kmsg_record(b"6,1,2,-;msg\n NOEQUALS\nnot indented=1\n =novalue\n A=1\n A=2\n\n")
    assert rec is not None
    assert rec.fields == {"A": "2"}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\n",
        b"garbage",
        b"6,339,5140900,-",  # no ';'
        b"6,339,5140900;msg",  # no flags field
        b"x,339,5140900,-;msg",
        b"6,-1,5140900,-;msg",
        b"6,339,abc,-;msg",
        b" 6,339,5140900,-;msg",
        b"99999999999,1,2,-;msg",  # prio out of range
        b"6,1,123456789012345678901,-;msg",  # usec beyond 64 bits
    ],
)
def test_malformed(data: bytes) -> None:
    assert parse_kmsg_record(data) is None


@settings(max_examples=200)
@given(st.binary())
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    rec = parse_kmsg_record(data)
    assert rec is None or 0 <= rec.priority <= 7


def kernel_escape(data: bytes) -> bytes:
    return b"".join(b"\\x%02x" % c if c < 0x20 or c >= 0x7F or c == ord("\\") else bytes((c,)) for c in data)


@settings(max_examples=200)
@given(
    prio=st.integers(0, 191),
    seq=st.integers(0, 2**64 - 1),
    usec=st.integers(0, 2**64 - 1),
    message=st.text(),
    fields=st.dictionaries(st.from_regex(r"[A-Z_]{1,10}", fullmatch=True), st.text(max_size=20), max_size=3),
    tail=st.binary(max_size=20),
)
def test_round_trip(
    prio: int, seq: int, usec: int, message: str, fields: dict[str, str], tail: bytes
) -> None:
    data = b"%d,%d,%d,-;" % (prio, seq, usec) + kernel_escape(message.encode()) + b"\n"
    data += b"".join(b" " + k.encode() + b"=" + kernel_escape(v.encode()) + b"\n" for k, v in fields.items())
    rec = parse_kmsg_record(data)
    assert rec == KmsgRecord(prio & 7, prio >> 3, seq, usec, "-", message, fields)
    # junk after the record never makes it raise
    parse_kmsg_record(data + tail)


def test_seq_tracker() -> None:
    t = SeqTracker()
    assert t.last is None
    assert t.observe(100) == 0  # first record: nothing known to be lost
    assert t.observe(101) == 0
    assert t.observe(106) == 4  # 102..105 overwritten
    assert t.observe(106) == 0  # repeated
    assert t.lost_total == 4
    assert t.observe(5) == 0  # backwards: ring reset (reboot); re-baseline
    assert t.last == 5
    assert t.observe(8) == 2
    assert t.lost_total == 6


@settings(max_examples=200)
@given(st.lists(st.integers(0, 10_000), min_size=1))
def test_seq_tracker_counts_gaps(seqs: list[int]) -> None:
    t = SeqTracker()
    expected = 0
    for prev, cur in zip([None, *seqs], seqs, strict=False):
        lost = t.observe(cur)
        assert lost >= 0
        if prev is not None and cur > prev:
            assert lost == cur - prev - 1
        else:
            assert lost == 0
        expected += lost
    assert t.lost_total == expected
