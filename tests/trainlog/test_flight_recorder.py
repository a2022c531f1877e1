"""Flight Recorder dumps: real ones (captured from torch 2.13 on CPU with gloo, see
tests/data/trainlog/README.md) read as JSON and as pickle without unpickling anything but basic types;
hostile and broken files refused."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from tests.trainlog.wire import DATA
from watchd.trainlog.flight_recorder import MAX_DUMP_BYTES, MAX_PGS, DumpError, load_dump, summarize


def test_real_dumps_in_both_formats_give_the_last_collectives_per_process_group() -> None:
    pkl = load_dump((DATA / "fr_gloo_2.13_rank0.pkl").read_bytes())
    js = load_dump((DATA / "fr_gloo_2.13_rank0.json").read_bytes())
    assert (pkl.format, js.format) == ("pickle", "json")
    [p] = summarize(pkl, rank=0, job="slurm:9")[0]
    # taken while the third allreduce was still in flight: completed 2, enqueued 4, pending seq 3
    assert (p.pg, p.last_enqueued, p.last_started, p.last_completed) == ("0", 4, -1, 2)
    assert (p.pending_op, p.pending_seq, p.entries, p.version, p.job) == (
        "gloo:all_reduce",
        3,
        4,
        "2.10",
        "slurm:9",
    )
    [j] = summarize(js, rank=0)[0]
    assert (j.last_enqueued, j.last_completed, j.pending_seq) == (4, 4, None)


def test_a_timed_out_ranks_dump_reads_the_same_in_json_and_pickle() -> None:
    a = summarize(load_dump((DATA / "fr_gloo_2.13_timeout_rank0.json").read_bytes()), rank=0)[0]
    b = summarize(load_dump((DATA / "fr_gloo_2.13_timeout_rank0.pkl").read_bytes()), rank=0)[0]
    strip = lambda rs: [{k: v for k, v in r.to_attrs().items() if k != "format"} for r in rs]  # noqa: E731
    assert strip(a) == strip(b) and a[0].last_completed == 3


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path("/tmp").joinpath, ("watchd-unpickled",))


def test_a_pickle_naming_any_global_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    hostile = pickle.dumps({"entries": [], "x": _Boom()})
    with pytest.raises(DumpError, match="refused"):
        load_dump(hostile)
    payload = pickle.dumps(print)  # builtins.print: a global too
    with pytest.raises(DumpError, match=r"builtins\.print"):
        load_dump(payload)
    # the classic: os.system through REDUCE
    command = f"touch {marker}".encode()
    size = len(command).to_bytes(4, "little")
    evil = b"\x80\x02cposix\nsystem\nq\x00X" + size + command + b"q\x01\x85q\x02Rq\x03."
    with pytest.raises(DumpError):
        load_dump(evil)
    assert not marker.exists() and "watchd-unpickled" not in sys.modules


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "neither JSON nor a pickle"),
        (b"hello", "neither JSON nor a pickle"),
        (b"{not json", "not valid JSON"),
        (b'{"version": "2.10"}', None),  # no entries: an empty dump reads (nothing to summarize)
        (b'{"entries": 3}', "no entries"),
        (b"[1, 2]", "neither JSON nor a pickle"),
        (pickle.dumps([1, 2, 3]), "not a Flight Recorder dump"),
        (pickle.dumps({"entries": []})[:-3], "not a readable pickle"),
        (b"{" + b'"a":[' * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),
    ],
)
def test_broken_files_are_a_clear_error(data: bytes, why: str | None) -> None:
    if why is None:
        assert summarize(load_dump(data), rank=0) == ([], 0)
        return
    with pytest.raises(DumpError, match=why):
        load_dump(data)


def test_size_and_process_groups_are_bounded() -> None:
    with pytest.raises(DumpError, match="larger than"):
        load_dump(b"{" + b" " * MAX_DUMP_BYTES + b"}")
    many = {
        "entries": [],
        "pg_status": {str(i): {"last_completed_collective": i} for i in range(MAX_PGS + 10)},
    }
    records, left_out = summarize(load_dump(pickle.dumps(many)), rank=1)
    assert len(records) == MAX_PGS and left_out == 10
    assert [r.last_completed for r in records[:3]] == [0, 1, 2]
