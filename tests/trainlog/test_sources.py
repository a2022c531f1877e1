"""The training-log sources with real files written as a job writes them, a real journalctl stand-in process,
Flight Recorder dumps appearing in a folder, and the agent shipping what they read to a real engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.agent.test_agent import agent_config, engine_config
from tests.support import eventually
from tests.trainlog.wire import DATA, real_lines
from watchd.agent.runner import Agent
from watchd.engine.runner import Engine
from watchd.sources.base import FakeLogSource, LogLine
from watchd.sources.flight_recorder import FlightRecorderSource
from watchd.sources.job_owners import FakeJobOwners
from watchd.sources.journald_units import JournaldUnitsSource, journal_entry
from watchd.sources.pod_logs import PodLogSource, pod_files, strip_cri
from watchd.sources.settings import SourcesConfig, TrainingLogsConfig
from watchd.sources.slurm_jobs import (
    FakeJobOutputs,
    JobOutput,
    JobOutputSource,
    expand_path,
    output_paths,
    parse_squeue,
    read_here,
)

TIMEOUT_LINE = next(line for name, line in real_lines() if "SeqNum=7753" in line)
IB_LINE = next(line for name, line in real_lines() if "status=12 opcode=0" in line)


class Reader:
    """Collects a source's lines in the background."""

    def __init__(self, lines: AsyncIterator[LogLine]) -> None:
        self.got: list[LogLine] = []
        self._task = asyncio.create_task(self._run(lines))

    async def _run(self, lines: AsyncIterator[LogLine]) -> None:
        async for line in lines:
            self.got.append(line)

    def texts(self) -> list[str]:
        return [line.text for line in self.got]

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def append(path: Path, *lines: str) -> None:
    with path.open("a") as fh:  # as a job's stdout: appended, flushed line by line
        for line in lines:
            fh.write(line + "\n")
            fh.flush()


async def test_job_output_files_are_followed_from_their_end_tagged_and_released(tmp_path: Path) -> None:
    out, err = tmp_path / "slurm-77.out", tmp_path / "slurm-77.err"
    append(out, "old line the agent must not read", TIMEOUT_LINE)
    jobs = FakeJobOutputs([JobOutput("slurm:77", (out, err))])
    source = JobOutputSource(jobs, poll_interval_s=0.05, follow_interval_s=0.05, grace_s=0.3)
    reader = Reader(source.lines())
    try:
        await eventually(lambda: len(source.follow.followed) == 2, what="both files followed")
        await asyncio.sleep(0.2)  # the followers opened the file that exists (at its end)
        append(out, "epoch 1", TIMEOUT_LINE)
        append(err, IB_LINE)  # stderr appears later: read from its start
        await eventually(lambda: len(reader.got) == 3, what="the new lines")
        assert sorted(reader.texts()) == sorted(["epoch 1", TIMEOUT_LINE, IB_LINE])
        assert {line.job for line in reader.got} == {"slurm:77"}
        assert len({line.key for line in reader.got}) == 3
        # rotation: the job's launcher renames the file and opens a new one
        os.rename(out, tmp_path / "slurm-77.out.1")
        append(tmp_path / "slurm-77.out.1", "written to the old file before the switch")
        append(out, "after rotation")
        await eventually(lambda: "after rotation" in reader.texts(), what="the rotated file's lines")
        assert "written to the old file before the switch" in reader.texts()
        # the job ends: its last lines within the grace period are read, then the files are released
        jobs.jobs = []
        append(out, "last words")
        await eventually(lambda: "last words" in reader.texts(), what="the dying job's last line")
        await eventually(lambda: source.follow.followed == {}, what="released")
        append(out, "after the job")
        await asyncio.sleep(0.3)
        assert "after the job" not in reader.texts()
    finally:
        await reader.stop()


async def test_files_beyond_the_bound_are_refused_and_counted(tmp_path: Path) -> None:
    jobs = FakeJobOutputs([JobOutput(f"slurm:{i}", (tmp_path / f"{i}.out",)) for i in range(5)])
    source = JobOutputSource(jobs, poll_interval_s=0.05, max_files=3)
    reader = Reader(source.lines())
    try:
        await eventually(lambda: source.follow.refused >= 2, what="refusals")
        assert len(source.follow.followed) == 3
    finally:
        await reader.stop()


def test_squeue_fields_cannot_be_faked_by_a_file_name_and_patterns_expand() -> None:
    token = "\x1f0123abcd"
    rows = [
        [
            "42_2",
            "42",
            "40",
            "2",
            "1000",
            "alice",
            "train",
            "/home/alice",
            "x StdOut=/etc/shadow",
            "%x-%A_%a.err",
            "gpu-1",
        ],
        ["43", "43", "N/A", "N/A", "1001", "bob", "n UserId=root(0)", "/home/bob", "", "", "gpu-2"],
        ["44", "44", "N/A", "N/A", "1002", "eve", "e", "/w\nJobArrayID=1", "/o%%u-%5j.log", "(null)", ""],
    ]
    text = "\n".join("".join(f + token for f in row) for row in rows) + "\n"
    parsed = parse_squeue(text, token)
    assert [p["JobArrayID"] for p in parsed] == ["42_2", "43", "44"]
    assert output_paths(parsed[0], "gpu-1") == (
        Path("/home/alice/x StdOut=/etc/shadow"),  # a name, not a second field
        Path("/home/alice/train-40_2.err"),
    )
    assert output_paths(parsed[1], "gpu-1") == (
        Path("/home/bob/slurm-43.out"),
    )  # the default, stderr with it
    assert output_paths(parsed[2], "gpu-1") == (Path("/o%u-00044.log"),)
    assert expand_path("/x/%u/%N-%j.log", parsed[0], "gpu-7") == "/x/alice/gpu-7-42.log"
    assert parse_squeue("1" + token + "garbage" + token, token) == []  # a short answer: nothing made up
    # a job's output file is read on its batch host only (or everywhere when squeue does not say)
    assert [read_here(p, "gpu-1") for p in parsed] == [True, False, True]


# --------------------------------------------------------------------------------- pods


def test_cri_records_and_pod_folders(tmp_path: Path) -> None:
    assert strip_cri("2026-12-04T18:00:00.000000001Z stdout F hello world") == ("hello world", True)
    assert strip_cri("2026-12-04T18:00:00.000000001Z stderr P part") == ("part", False)
    assert strip_cri("2026-12-04T18:00:00Z stdout F") == ("", True)
    assert strip_cri("plain text") is None
    uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    c = tmp_path / f"ml_trainer-0_{uid}" / "trainer"
    c.mkdir(parents=True)
    for name in ("0.log", "1.log", "0.log.20261204-180000"):
        (c / name).write_text("")
    (tmp_path / "not_a_pod_dir").mkdir()
    assert [(f.path.name, f.job) for f in pod_files(tmp_path)] == [("1.log", f"k8s:{uid}")]
    assert pod_files(tmp_path / "missing") == []


async def test_pod_logs_are_followed_partial_lines_joined(tmp_path: Path) -> None:
    uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    c = tmp_path / f"ml_trainer-0_{uid}" / "trainer"
    c.mkdir(parents=True)
    log = c / "0.log"
    log.write_text("2026-12-04T18:00:00.1Z stdout F before the agent\n")
    source = PodLogSource(tmp_path, poll_interval_s=0.05, follow_interval_s=0.05)
    reader = Reader(source.lines())
    try:
        await eventually(lambda: len(source.follow.followed) == 1, what="the pod's log followed")
        await asyncio.sleep(0.2)
        half = len(TIMEOUT_LINE) // 2
        append(
            log,
            f"2026-12-04T18:00:01.1Z stderr P {TIMEOUT_LINE[:half]}",
            f"2026-12-04T18:00:01.2Z stderr F {TIMEOUT_LINE[half:]}",
            "2026-12-04T18:00:02.1Z stdout F step 12",
        )
        await eventually(lambda: len(reader.got) == 2, what="two lines")
        assert reader.texts() == [TIMEOUT_LINE, "step 12"]
        assert {line.job for line in reader.got} == {f"k8s:{uid}"}
        # an endless partial line never grows past its bound
        append(log, *[f"2026-12-04T18:00:03Z stdout P {'x' * 4096}" for _ in range(64)])
        await asyncio.sleep(0.3)
        assert all(len(p) <= 1 << 16 for p in source._partial.values())
    finally:
        await reader.stop()


# --------------------------------------------------------------------------------- journald


def test_journal_entries() -> None:
    entry = {"MESSAGE": "hello", "__REALTIME_TIMESTAMP": "1764800000123456", "__CURSOR": "s=abc;i=1"}
    assert journal_entry(json.dumps(entry).encode()) == ("hello", 1764800000.123456, "s=abc;i=1")
    assert journal_entry(json.dumps({"MESSAGE": list(b"caf\xc3\xa9 \xff")}).encode()) == (
        "café \ufffd",
        None,
        None,
    )
    assert journal_entry(b"not json") is None
    assert journal_entry(b"[1]") is None
    assert journal_entry(json.dumps({"MESSAGE": 3}).encode()) is None


async def test_journald_source_reads_a_real_process_json_and_counts_what_it_cannot(tmp_path: Path) -> None:
    script = tmp_path / "journalctl"
    entries = [
        {"MESSAGE": TIMEOUT_LINE, "__REALTIME_TIMESTAMP": "1764800000000000", "__CURSOR": "c1"},
        {"MESSAGE": "two\nlines", "__REALTIME_TIMESTAMP": "1764800001000000", "__CURSOR": "c2"},
    ]
    body = (
        "".join(json.dumps(e) + "\n" for e in entries)
        + "garbage\n"
        + json.dumps({"MESSAGE": "x" * 5000})
        + "\n"
    )
    (tmp_path / "out.jsonl").write_text(body)
    script.write_text(
        f"#!{sys.executable}\nimport sys, time\n"
        f"open({str(tmp_path / 'argv')!r}, 'w').write(' '.join(sys.argv[1:]))\n"
        f"sys.stdout.write(open({str(tmp_path / 'out.jsonl')!r}).read())\n"
        "sys.stdout.flush(); time.sleep(30)\n"
    )
    script.chmod(0o755)
    source = JournaldUnitsSource(["train.service", "launcher.service"], command=(str(script),), max_line=4096)
    reader = Reader(source.lines())
    try:
        await eventually(lambda: len(reader.got) == 3 and source.malformed == 2, what="the entries")
        assert reader.texts() == [TIMEOUT_LINE, "two", "lines"]
        assert [line.key for line in reader.got] == ["journal:c1", "journal:c2", "journal:c2:1"]
        assert reader.got[0].time == 1764800000.0
        argv = (tmp_path / "argv").read_text()
        assert argv == "--follow --lines=0 --output=json --unit=train.service --unit=launcher.service"
    finally:
        await reader.stop()


# --------------------------------------------------------------------------------- Flight Recorder


def test_flight_recorder_dumps_are_read_once_stable_and_again_when_changed(tmp_path: Path) -> None:
    job_dir = tmp_path / "4242"
    job_dir.mkdir()
    dump = (DATA / "fr_gloo_2.13_rank0.pkl").read_bytes()
    (job_dir / "nccl_trace_rank_3").write_bytes(dump)
    (job_dir / "nccl_trace_rank_4").write_bytes(pickle.dumps({"entries": [], "x": print}))  # refused
    (job_dir / "unrelated.txt").write_text("x")
    source = FlightRecorderSource("gpu-2", [tmp_path], job_owners=FakeJobOwners({"4242": os.geteuid()}))
    assert source.scan() == []  # first sight: wait until it holds still
    [event] = source.scan()
    assert (event.kind, event.node, event.attrs["rank"], event.attrs["job"]) == (
        "flight_recorder",
        "gpu-2",
        3,
        "slurm:4242",
    )
    assert (event.attrs["last_completed"], event.attrs["pending_seq"], event.attrs["format"]) == (
        2,
        3,
        "pickle",
    )
    assert source.unreadable == 1 and source.read == 1 and source.refused == {"code": 1}
    assert source.scan() == []  # unchanged: not read again
    (job_dir / "nccl_trace_rank_3").write_bytes((DATA / "fr_gloo_2.13_rank0.json").read_bytes())
    source.scan()
    [again] = source.scan()
    assert again.attrs["last_completed"] == 4 and again.id != event.id


# --------------------------------------------------------------------------------- agent -> engine


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    async with Engine(engine_config(0), use_config_scheduler=False) as e:
        yield e


async def test_the_agent_ships_training_events_and_the_engine_keeps_them_as_evidence(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dir = tmp_path / "4242"
    job_dir.mkdir()
    config = agent_config(engine.port).model_copy(
        update={
            "sources": SourcesConfig(
                training=TrainingLogsConfig(
                    flight_recorder_dirs=[tmp_path], flight_recorder_poll_s=0.05, max_events_per_minute=5
                )
            )
        }
    )
    # the dump's job is Slurm job 4242 only because squeue says 4242 runs as the file's owner
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(f"#!/bin/sh\necho '4242 4242 {os.geteuid()}'\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    source = FakeLogSource("file:/var/log/train.log")
    async with Agent(config, sources=[source]) as agent:
        source.inject_log("\n".join(line for _, line in real_lines()))
        (job_dir / "nccl_trace_rank_1").write_bytes((DATA / "fr_gloo_2.13_timeout_rank0.json").read_bytes())
        (job_dir / "nccl_trace_rank_2").symlink_to("/dev/zero")  # refused unopened, counted
        refused = agent.metrics.files_refused.labels("flight-recorder", "symlink")
        await eventually(lambda: refused._value.get() == 1, what="the link refused")
        training = engine.correlator.fleet.training
        await eventually(lambda: training.ranks("slurm:4242") != [], what="the dump's evidence")
        [rank] = training.ranks("slurm:4242")
        assert (rank.rank, rank.last_completed, rank.completed_from) == (1, 3, "flight_recorder")
        # the first 5 NCCL warnings pass the bound: 4 of them NET/IB completion errors
        await eventually(
            lambda: len(training.nic_errors("slurm:0", ("gpu-3",), 0, 1e12).get("gpu-3", [])) == 4,
            what="the NIC errors",
        )
        # 9 timeouts in the file, at most 5 per job and kind a minute: the rest dropped and counted
        assert agent.metrics.dropped.labels("trainlog_rate")._value.get() > 0
        kinds = agent.metrics.events.labels("file", "collective_timeout")._value.get()
        assert kinds == 5
