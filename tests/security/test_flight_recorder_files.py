"""The Flight Recorder source facing files a user put in its folders: links, FIFOs, files that grow after they
were looked at, folders named after someone else's job. Each poll must finish (a watchdog thread), read
nothing it should not, and say why."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import watchd.sources.flight_recorder as fr_source
from tests.support import eventually
from tests.trainlog.wire import DATA
from watchd.clock import FakeClock
from watchd.model.events import Event
from watchd.sources.flight_recorder import FlightRecorderSource
from watchd.sources.job_owners import FakeJobOwners, JobOwner, SlurmJobOwners

NOBODY = 65534
DUMP = (DATA / "fr_gloo_2.13_rank0.pkl").read_bytes()


def within(fn: Callable[[], Any], timeout: float = 20.0) -> Any:
    """``fn()``, which must finish within ``timeout`` seconds (a FIFO opened for reading would block)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still running after {timeout} s"
    return out[0]


def settle(source: FlightRecorderSource) -> list[Event]:
    """Two polls: the first sees the files, the second reads those that held still."""
    within(source.scan)
    events: list[Event] = within(source.scan)
    return events


def test_a_link_to_dev_zero_and_a_fifo_are_refused_unopened(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_0").symlink_to("/dev/zero")  # stat says 0 bytes; a read never ends
    os.mkfifo(tmp_path / "nccl_trace_rank_1")  # a read waits for a writer forever
    (tmp_path / "nccl_trace_rank_2").symlink_to(tmp_path / "elsewhere")  # a link to a real dump
    (tmp_path / "elsewhere").write_bytes(DUMP)
    reasons: list[str] = []
    source = FlightRecorderSource("gpu-1", [tmp_path], on_refused=reasons.append)
    assert settle(source) == []
    assert source.refused == {"symlink": 2, "not_regular": 1} and source.read == 0
    assert sorted(reasons) == ["not_regular", "symlink", "symlink"]
    assert within(source.scan) == [] and source.refused.total() == 3  # refused once, not at every poll


def test_a_file_grown_after_it_was_looked_at_is_read_no_further_than_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fr_source, "MAX_DUMP_BYTES", 4096)
    dump = tmp_path / "nccl_trace_rank_0"
    dump.write_bytes(DUMP)  # 1,493 bytes when its size is looked at
    real_open = fr_source.open_untrusted
    read: list[int] = []

    def grow_then_open(path: Path | str, **kw: Any) -> int:
        os.truncate(path, 1 << 30)  # a writer appends a GiB between the look and the read (sparse)
        fd = real_open(path, **kw)
        read.append(fd)
        return fd

    monkeypatch.setattr(fr_source, "open_untrusted", grow_then_open)
    real_read = fr_source.read_bounded
    sizes: list[int] = []

    def counting_read(fd: int, limit: int, path: Path | str) -> bytes:
        try:
            return real_read(fd, limit, path)
        finally:
            sizes.append(os.lseek(fd, 0, os.SEEK_CUR))

    monkeypatch.setattr(fr_source, "read_bounded", counting_read)
    source = FlightRecorderSource("gpu-1", [tmp_path])
    assert settle(source) == []
    assert source.refused == {"too_large": 1} and source.too_large == 1 and read
    assert sizes == [4097]  # stopped one byte past the bound


def test_a_file_larger_than_the_bound_is_not_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fr_source, "MAX_DUMP_BYTES", 1024)
    (tmp_path / "nccl_trace_rank_0").write_bytes(DUMP)
    opened: list[object] = []
    monkeypatch.setattr(fr_source, "open_untrusted", lambda *a, **k: opened.append(a))
    source = FlightRecorderSource("gpu-1", [tmp_path])
    assert settle(source) == [] and source.refused == {"too_large": 1} and opened == []


def test_hostile_content_is_counted_by_reason(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"\x80\x02Nr\xff\xff\xff\xff.")  # the memo bomb
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"\x80\x02cos\nsystem\n.")
    (tmp_path / "nccl_trace_rank_2").write_bytes(b"not a dump")
    (tmp_path / "nccl_trace_rank_3").write_bytes(DUMP)
    source = FlightRecorderSource("gpu-1", [tmp_path])
    events = settle(source)
    assert source.refused == {"limits": 1, "code": 1, "malformed": 1} and source.unreadable == 3
    assert [e.attrs["rank"] for e in events] == [3] and source.read == 1


# ------------------------------------------------------------------------------------ whose job


def _job_dump(root: Path, job: str = "4242") -> Path:
    folder = root / job
    folder.mkdir()
    path = folder / "nccl_trace_rank_0"
    path.write_bytes(DUMP)
    return path


def test_a_dump_is_a_jobs_only_when_the_job_runs_as_the_files_owner(tmp_path: Path) -> None:
    me = os.geteuid()
    _job_dump(tmp_path)
    [event] = settle(FlightRecorderSource("gpu-1", [tmp_path], job_owners=FakeJobOwners({"4242": me})))
    assert event.attrs["job"] == "slurm:4242"
    source = FlightRecorderSource("gpu-1", [tmp_path], job_owners=FakeJobOwners({"4242": NOBODY}))
    [event] = settle(source)  # someone else's job: read, but taken as no job's
    assert "job" not in event.attrs and source.unattributed == 1
    source = FlightRecorderSource("gpu-1", [tmp_path], job_owners=FakeJobOwners({}))
    [event] = settle(source)  # a job Slurm does not know on this node
    assert "job" not in event.attrs and source.unattributed == 1
    [event] = settle(FlightRecorderSource("gpu-1", [tmp_path]))  # nobody to ask: no job
    assert "job" not in event.attrs


def test_a_hard_link_or_a_folder_of_another_user_names_no_job(tmp_path: Path) -> None:
    me = os.geteuid()
    owners = FakeJobOwners({"4242": me, "4243": me})
    path = _job_dump(tmp_path)
    os.link(path, tmp_path / "other")  # the same file under another name: which job wrote it is unclear
    source = FlightRecorderSource("gpu-1", [tmp_path], job_owners=owners)
    [event] = settle(source)
    assert "job" not in event.attrs and source.unattributed == 1
    if me != 0:
        return  # the rest needs a folder of another owner
    folder_path = _job_dump(tmp_path, "4243")
    os.unlink(path)
    os.chown(folder_path.parent, NOBODY, NOBODY)
    source = FlightRecorderSource("gpu-1", [tmp_path], job_owners=owners)
    [event] = settle(source)
    assert "job" not in event.attrs and source.unattributed == 1


def test_many_folders_cannot_crowd_the_jobs_out(tmp_path: Path) -> None:
    for i in range(fr_source._MAX_FOLDERS + 20):
        (tmp_path / f"junk{i:04d}").mkdir()
    _job_dump(tmp_path)
    (tmp_path / "4242" / "deeper").mkdir()
    (tmp_path / "4242" / "deeper" / "nccl_trace_rank_5").write_bytes(DUMP)  # two levels down: not looked at
    [event] = settle(FlightRecorderSource("gpu-1", [tmp_path]))
    assert event.attrs["rank"] == 0


async def test_polls_run_in_the_user_file_threads(tmp_path: Path) -> None:
    source = FlightRecorderSource("gpu-1", [tmp_path], poll_interval_s=0.01)
    threads: list[str] = []
    real_scan = source.scan

    def scan() -> list[Event]:
        threads.append(threading.current_thread().name)
        return real_scan()

    source.scan = scan  # type: ignore[method-assign]
    task = asyncio.ensure_future(source.events().__anext__())
    await eventually(lambda: len(threads) >= 2, what="two polls")
    task.cancel()
    assert all(name.startswith("watchd-user-files") for name in threads)


# -------------------------------------------------------------------------------- Slurm job owners


def test_slurm_job_owners_are_asked_of_squeue_at_most_once_a_ttl(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    squeue = tmp_path / "squeue"
    rows = ["4242 4242 1000", " 77 77 0", "junk", "٣ ٣ 5", "4243 4243 1001 x", "4250 4240_3 1002"]
    (tmp_path / "rows").write_text("\n".join(rows) + "\n")
    squeue.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncat {tmp_path / "rows"}\n')
    squeue.chmod(0o755)
    clock = FakeClock()
    owners = SlurmJobOwners("gpu-1", squeue=str(squeue), ttl_s=15.0, clock=clock)
    assert owners.owner("4242") == JobOwner("slurm:4242", 1000)
    assert owners.owner("77") == JobOwner("slurm:77", 0)
    # an array task: by its id or its label, named by its label as the job-output source names it
    assert owners.owner("4250") == owners.owner("4240_3") == JobOwner("slurm:4240_3", 1002)
    assert owners.owner("4243") is None and owners.owner("٣") is None and owners.owner("junk") is None
    assert calls.read_text().splitlines() == ["--noheader --nodelist=gpu-1 --states=all --format=%A %i %U"]
    clock.advance(15.0)
    owners.owner("1")
    assert len(calls.read_text().splitlines()) == 2
    missing = SlurmJobOwners("gpu-1", squeue=str(tmp_path / "no-squeue"), clock=clock)
    assert missing.owner("4242") is None and missing.errors == 1
