"""Hostile Flight Recorder dumps, crafted opcode by opcode: each is refused or summarized in bounded time
(a watchdog thread: it must finish) and bounded memory (tracemalloc's peak), and no code runs."""

from __future__ import annotations

import pickle
import re
import threading
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from tests.trainlog.wire import DATA
from watchd.trainlog.flight_recorder import MAX_DEPTH, MAX_ENTRIES, DumpError, load_dump, summarize
from watchd.trainlog.plain_pickle import Limits, PickleError, read_pickle

MiB = 1 << 20


def bounded(fn: Callable[[], Any], *, timeout: float = 60.0, trace: bool = True) -> tuple[Any, int]:
    """``fn()``, which must return (or raise) within ``timeout`` seconds, and the peak of the memory traced
    while it ran, in bytes (0 without ``trace``: tracemalloc slows the reader down ~30 times)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    if trace:
        tracemalloc.start()
    try:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout)
        peak = tracemalloc.get_traced_memory()[1] if trace else 0
    finally:
        if trace:
            tracemalloc.stop()
    assert not thread.is_alive(), f"still running after {timeout} s"
    if "error" in out:
        raise out["error"]
    return out["value"], peak


def refused(data: bytes, reason: str, match: str = "", *, trace: bool = True) -> int:
    """Asserts ``load_dump(data)`` is refused for ``reason`` with a message matching ``match``, within 60 s;
    the peak memory meanwhile."""

    def attempt() -> DumpError | None:
        try:
            load_dump(data)
        except DumpError as exc:
            return exc
        return None

    error, peak = bounded(attempt, trace=trace)
    assert error is not None, "read, not refused"
    assert error.reason == reason and re.search(match, str(error)), f"{error.reason}: {error}"
    assert isinstance(peak, int)
    return peak


class Ops:
    """A pickle written opcode by opcode."""

    def __init__(self, proto: int = 2) -> None:
        self.data = bytearray(b"\x80" + bytes([proto]))

    def raw(self, opcodes: bytes) -> Ops:
        self.data += opcodes
        return self

    def str(self, text: str) -> Ops:
        raw = text.encode()
        return self.raw(b"X" + len(raw).to_bytes(4, "little") + raw)

    def put(self, index: int) -> Ops:
        return self.raw(b"r" + index.to_bytes(4, "little"))

    def get(self, index: int) -> Ops:
        return self.raw(b"j" + index.to_bytes(4, "little"))

    def done(self) -> bytes:
        return bytes(self.data + b".")


def shared_lists(levels: int) -> Ops:
    """memo[i] is L(i): L(0) = [], L(i) = [L(i-1), L(i-1)]. ``levels`` + 1 lists, 2**levels leaves."""
    p = Ops().raw(b"]").put(0).raw(b"0")
    for i in range(1, levels + 1):
        p.raw(b"]").put(i).raw(b"(").get(i - 1).get(i - 1).raw(b"e0")
    return p


def dump_of_everywhere(p: Ops, index: int, entries: int = 3) -> bytes:
    """A dump whose every field the summary reads is memo[index]."""
    p.raw(b"}(").str("version").get(index)
    p.str("pg_status").raw(b"}(").str("0").raw(b"}(")
    for key in ("last_enqueued_collective", "last_started_collective", "last_completed_collective"):
        p.str(key).get(index)
    p.raw(b"uu").str("entries").raw(b"](")
    for _ in range(entries):
        p.raw(b"}(").str("process_group").raw(b"](").get(index).get(index).raw(b"e")
        for key in ("pg_id", "state", "collective_seq_id", "profiling_name"):
            p.str(key).get(index)
        p.raw(b"u")
    return p.raw(b"eu").done()


# --------------------------------------------------------------------------------------------- memory


def test_a_nine_byte_memo_bomb_is_refused_before_anything_is_allocated() -> None:
    bomb = b"\x80\x02Nr\xff\xff\xff\xff."  # LONG_BINPUT 4294967295: the C unpickler's memo takes 64 GiB
    assert len(bomb) == 9
    assert refused(bomb, "limits", "memo index 4294967295") < MiB
    assert refused(b"\x80\x02Nq\xff.", "limits", "memo index 255") < MiB  # BINPUT past the end
    assert refused(b"\x80\x02j\xff\xff\xff\x7f.", "malformed", "memo index") < MiB  # LONG_BINGET of nothing
    # a PUT a little past the end is tolerated (the holes cannot be read) and charged
    assert read_pickle(b"\x80\x02Nr\x05\x00\x00\x000h\x05.") is None
    with pytest.raises(PickleError, match="memo index 2 read before"):
        read_pickle(b"\x80\x02Nr\x05\x00\x00\x000h\x02.")


def test_floods_stop_at_the_memory_and_opcode_bounds() -> None:
    dups = b"\x80\x02]" + b"2" * 300_000 + b"."  # DUP 300,000 times: 2.3 MiB of stack
    error, peak = bounded(lambda: _error(lambda: read_pickle(dups, Limits(max_memory=MiB // 4))))
    assert isinstance(error, PickleError) and error.reason == "limits" and "more than 0.25 MiB" in str(error)
    assert peak < MiB
    appends = b"\x80\x02]" + b"(Ne" * 500_000 + b"."  # a list grown item by item
    error, _ = bounded(lambda: _error(lambda: read_pickle(appends, Limits(max_ops=100_000))), trace=False)
    assert "more than 100000 opcodes" in str(error)
    memos = b"\x80\x02N" + b"\x94" * 1_000_000 + b"."  # MEMOIZE the same value a million times
    with pytest.raises(PickleError, match="MiB of values"):
        read_pickle(memos, Limits(max_memory=MiB))
    assert read_pickle(memos) is None  # 8 MiB of memo: within the default bound


def _error(fn: Callable[[], Any]) -> PickleError | None:
    try:
        fn()
    except PickleError as exc:
        return exc
    return None


# ----------------------------------------------------------------------------- shared graphs, nesting


def test_a_shared_list_dag_is_summarized_without_expanding_it() -> None:
    levels = MAX_DEPTH - 5  # as deep as the bound allows under entries[i]["process_group"]
    data = dump_of_everywhere(shared_lists(levels), levels)
    assert len(data) < 2048  # 2**27 leaves as a tree: str() would build gigabytes for minutes
    dump, peak = bounded(lambda: load_dump(data), timeout=30)
    assert peak < 4 * MiB
    (records, left_out), peak = bounded(lambda: summarize(dump, rank=0), timeout=30)
    assert peak < MiB and left_out == 0
    by_entries, by_status = records  # the entries' process group is a list: no name
    assert (by_entries.pg, by_entries.last_enqueued, by_entries.pending_op) == ("", -1, None)
    assert (by_status.pg, by_status.last_completed, by_status.version) == ("0", -1, None)
    assert (by_entries.entries, by_status.entries) == (3, 0)


def test_a_dag_deeper_than_the_bound_is_refused_without_expanding_it() -> None:
    data = dump_of_everywhere(shared_lists(200), 200)  # 2**200 leaves as a tree
    assert refused(data, "limits", f"nested more than {MAX_DEPTH} deep") < MiB


def test_a_list_inside_itself_is_refused() -> None:
    loop = Ops().raw(b"]").put(0).raw(b"(").get(0).get(0).raw(b"e").done()  # L = [L, L]
    assert refused(loop, "limits", "contains itself") < MiB
    via_dict = Ops().raw(b"}").put(0).str("entries").raw(b"](").get(0).raw(b"es").done()
    refused(via_dict, "limits", "contains itself")


def test_deep_nesting_is_refused_not_a_crash() -> None:
    nested = b"\x80\x02" + b"]" * 20_000 + b"a" * 19_999 + b"."  # [[[[...]]]] 20,000 deep
    assert refused(nested, "limits", f"nested more than {MAX_DEPTH} deep") < 4 * MiB
    marks = b"\x80\x02" + b"(" * 100_000 + b"."
    assert refused(marks, "limits", "marks nested") < MiB
    json_deep = b'{"entries": [' + b"[" * 40 + b"]" * 40 + b"]}"
    refused(json_deep, "limits", f"nested more than {MAX_DEPTH} deep")
    just_right = b'{"entries": [' + b"[" * (MAX_DEPTH - 2) + b"]" * (MAX_DEPTH - 2) + b"]}"
    assert summarize(load_dump(just_right), rank=0) == ([], 0)


# ------------------------------------------------------------------------- sizes checked before built


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x80\x02\x8b\xff\xff\xff\x7f.", "an integer of 2147483647 bytes"),  # LONG4, 2 GiB, not there
        (b"\x80\x02\x8a\x11" + b"\x01" * 17 + b".", "an integer of 17 bytes"),  # LONG1, 136 bits
        (b"\x80\x04\x8d" + (1 << 62).to_bytes(8, "little") + b".", "a string of"),  # BINUNICODE8
        (b"\x80\x04\x8e" + (1 << 40).to_bytes(8, "little") + b".", "a string of"),  # BINBYTES8
        (b"\x80\x02X\xff\xff\xff\xff.", "a string of 4294967295 bytes"),  # BINUNICODE
        (b"\x80\x02X\x01\x00\x10\x00" + b"a" * (MiB + 1) + b".", "a string of 1048577 bytes"),
    ],
)
def test_huge_integers_and_strings_are_refused_before_they_are_built(data: bytes, match: str) -> None:
    assert refused(data, "limits", match) < MiB


def test_numbers_beyond_64_bits_and_long_strings_summarize_as_nothing() -> None:
    big = "9" * 1_000_000  # one string, shared by every entry: cut before any copy of it
    entry = {"collective_seq_id": 7, "state": big, "process_group": [big], "profiling_name": big}
    status = {"x": {"last_enqueued_collective": 1 << 100, "last_completed_collective": big}}
    data = pickle.dumps({"version": 1 << 120, "pg_status": status, "entries": [entry] * 100_000}, protocol=2)
    dump = load_dump(data)
    (records, _), peak = bounded(lambda: summarize(dump, rank=0))
    assert peak < 8 * MiB
    x, nines = records
    assert (x.pg, x.last_enqueued, x.last_completed, x.version) == ("x", -1, -1, None)
    assert len(nines.pg) == 512 and (nines.last_enqueued, nines.entries) == (-1, 100_000)
    assert nines.pending_op == "9" * 512 and nines.pending_seq == 7
    for odd in ("9" * 40, "²", "--5", "-", "", "1e3", " 7"):  # not a number: no sequence, no crash
        [record] = summarize(load_dump(pickle.dumps({"entries": [{"collective_seq_id": odd}]})), rank=0)[0]
        assert record.last_enqueued == -1
    entry = {"collective_seq_id": "7", "state": "scheduled"}
    [record] = summarize(load_dump(pickle.dumps({"entries": [entry]})), rank=0)[0]
    assert (record.last_enqueued, record.pending_seq) == (7, 7)


def test_too_many_entries_or_process_groups_are_refused() -> None:
    many = b"\x80\x02}X\x07\x00\x00\x00entries](N" + b"2" * MAX_ENTRIES + b"es."
    refused(many, "limits", f"more than {MAX_ENTRIES} entries", trace=False)


@pytest.mark.parametrize(
    "key",
    [b"N\x85", b"\x8a\x09" + b"\x01" * 9, b"G" + b"\x00" * 8, b"]"],  # a tuple, 2**64+, a float, a list
)
def test_dict_keys_are_strings_or_small_numbers(key: bytes) -> None:
    refused(b"\x80\x02}" + key + b"Ns.", "malformed", "a dict key of type")


# ------------------------------------------------------------------------------------------------ code


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00id\x85R.", r"references os\.system \(GLOBAL\)"),
        (b"\x80\x04\x8c\x02os\x8c\x06system\x93.", r"references os\.system \(STACK_GLOBAL\)"),
        (b"\x80\x02N)R.", "REDUCE"),
        (b"\x80\x02}}b.", "BUILD"),
        (b"\x80\x02(ios\nsystem\n.", r"references os\.system \(INST\)"),
        (b"\x80\x02(N)o.", "OBJ"),
        (b"\x80\x02N)\x81.", "NEWOBJ"),
        (b"\x80\x04N)}\x92.", "NEWOBJ_EX"),
        (b"\x80\x02\x82\x01.", "EXT1"),
        (b"\x80\x02\x83\x01\x00.", "EXT2"),
        (b"\x80\x02\x84\x01\x00\x00\x00.", "EXT4"),
        (b"\x80\x02P1\n.", "persistent ids"),
        (b"\x80\x02NQ.", "persistent ids"),
        (b"\x80\x05\x97.", "NEXT_BUFFER"),
        (b"\x80\x05\x98.", "READONLY_BUFFER"),
    ],
)
def test_every_opcode_that_could_run_code_is_refused(data: bytes, match: str) -> None:
    refused(data, "code", "refused: .*" + match)


def test_opcodes_plain_data_does_not_use_are_not_read() -> None:
    for data in (b"\x80\x02I1\n.", b"\x80\x02S'a'\n.", b"\x80\x04\x8f.", b"\x80\x05\x96\x00" + bytes(8)):
        refused(data, "malformed", "not a readable pickle")
    refused(b"\x80\x01N.", "malformed", "protocol 1")
    refused(b"\x80\x02X\x01\x00\x00\x00\xff.", "malformed", "not UTF-8")


# ------------------------------------------------------------------------------------------ real dumps


def test_real_dumps_read_exactly_as_the_standard_unpickler_reads_them() -> None:
    for name in ("fr_gloo_2.13_rank0.pkl", "fr_gloo_2.13_timeout_rank0.pkl"):
        data = (DATA / name).read_bytes()
        assert read_pickle(data) == pickle.loads(data)
    value = {"a": [1, -1, 1 << 62, -(1 << 70), 1.5, None, True, "é😀", b"raw", ("t", 2)], "b": {"c": {}}}
    for proto in (3, 4, 5):
        data = pickle.dumps([value, value], protocol=proto)
        got = read_pickle(data)
        assert got == pickle.loads(data) and got[0] is got[1]
