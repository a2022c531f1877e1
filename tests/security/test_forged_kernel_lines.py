"""Forged kernel lines are never Xid evidence (issue 22): a process can write ``/dev/kmsg`` (it gets the user
facility, never the kernel's), ``logger -t kernel`` into syslog (a followed file says nothing of its writer)
or into the journal (``_TRANSPORT=syslog``). Real engine, real agent, the real journalctl."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support import eventually, real_components_required, scheduler_actions
from watchd.agent.runner import Agent
from watchd.agent.settings import EngineEndpoint, HeartbeatConfig, ShipperConfig
from watchd.config import AgentConfig, EngineConfig
from watchd.credentials import TokenSource
from watchd.engine.runner import Engine
from watchd.http_settings import Listen
from watchd.sources.base import LogLine
from watchd.sources.journald import JournaldSource, line_of_entry
from watchd.sources.kmsg import KmsgSource
from watchd.sources.kmsg_record import parse_kmsg_record
from watchd.sources.settings import FileSourceConfig, KmsgConfig, SourcesConfig

FORGED = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
GENUINE = "NVRM: Xid (PCI:0000:5e:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def kmsg_record(prio: int, seq: int, text: str) -> bytes:
    return f"{prio},{seq},1000000,-;{text}\n".encode()


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    config = EngineConfig(listen=Listen(port=0), auth=TokenSource(token="tok"), mode="dry-run")
    async with Engine(config, use_config_scheduler=False) as e:
        yield e


def agent_config(port: int, sources: SourcesConfig | None = None) -> AgentConfig:
    return AgentConfig(
        node="gpu-3",
        engine=EngineEndpoint(url=f"http://127.0.0.1:{port}", auth=TokenSource(token="tok"), timeout_s=2),
        listen=Listen(port=0),
        sources=sources or SourcesConfig(kmsg=KmsgConfig(enabled=False)),
        heartbeat=HeartbeatConfig(enabled=False),
        shipper=ShipperConfig(backoff_initial_s=0.05, backoff_max_s=0.2, shutdown_flush_s=0.2),
    )


def drained(engine: Engine) -> list[str]:
    return [a.params["reason"] for a in scheduler_actions(engine.audit.entries) if a.action == "drain"]


def test_kmsg_records_carry_their_facility() -> None:
    # what `echo "<4>NVRM: Xid ..." > /dev/kmsg` (or systemd's kmsg logging) leaves: facility 1 (user)
    user = parse_kmsg_record(kmsg_record(12, 1, FORGED))
    kernel = parse_kmsg_record(kmsg_record(4, 2, GENUINE))
    assert user is not None and kernel is not None
    assert (user.facility, user.priority, kernel.facility, kernel.priority) == (1, 4, 0, 4)


async def test_a_user_facility_xid_in_kmsg_drains_nothing_the_kernels_does(engine: Engine) -> None:
    writer, reader = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reader.setblocking(False)
    source = KmsgSource(opener=lambda: os.dup(reader.fileno()), boot_id="b1")
    try:
        async with Agent(agent_config(engine.port), sources=[source]) as agent:
            writer.send(kmsg_record(12, 1, FORGED))  # facility 1: a process wrote it
            writer.send(kmsg_record(4, 2, GENUINE))  # facility 0: the kernel
            await eventually(lambda: len(drained(engine)) == 1, what="the genuine drain")
            await asyncio.sleep(0.3)
            assert agent.metrics.xid_untrusted.labels("kmsg")._value.get() == 1
            assert agent.metrics.events.labels("kmsg", "xid")._value.get() == 1
        assert ["0000:5e:00.0" in r for r in drained(engine)] == [True]
    finally:
        writer.close()
        reader.close()


def _kmsg_writable() -> bool:
    try:
        os.close(os.open("/dev/kmsg", os.O_RDWR | os.O_NONBLOCK))
    except OSError:
        return False
    return True


async def test_a_line_a_process_writes_to_the_real_dev_kmsg_is_untrusted(tmp_path: Path) -> None:
    if not _kmsg_writable():
        if real_components_required():
            pytest.fail("/dev/kmsg must be writable under CI (root)")
        pytest.skip("/dev/kmsg is not writable here (needs root)")
    marker = f"watchd-security-test {os.getpid()} {tmp_path.name}"  # not an Xid: other agents here read it
    source = KmsgSource(Path("/dev/kmsg"), None)
    seen: list[LogLine] = []

    async def read() -> None:
        async for line in source.lines():
            if marker in line.text:
                seen.append(line)
                return

    task = asyncio.create_task(read())
    await asyncio.sleep(0.3)  # it starts at the end
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<0>{marker}\n")  # even asking for facility 0 (LOG_KERN) gets the user facility
    await asyncio.wait_for(task, 5)
    assert [line.trusted for line in seen] == [False]


async def test_a_followed_file_is_untrusted_unless_vouched_for(engine: Engine, tmp_path: Path) -> None:
    syslog = tmp_path / "syslog"
    syslog.write_text("")
    trusted = tmp_path / "nvidia.log"
    trusted.write_text("")
    sources = SourcesConfig(
        kmsg=KmsgConfig(enabled=False),
        files=[
            FileSourceConfig(path=syslog, poll_interval_s=0.05),
            FileSourceConfig(path=trusted, poll_interval_s=0.05, trust="any-writer"),
        ],
    )
    async with Agent(agent_config(engine.port, sources)) as agent:
        await asyncio.sleep(0.3)
        # what `logger -t kernel "NVRM: Xid ..."` puts in /var/log/syslog as any user
        with syslog.open("a") as f:
            f.write(f"Dec  4 19:00:00 gpu-3 kernel: {FORGED}\n")
        with trusted.open("a") as f:
            f.write(f"Dec  4 19:00:01 gpu-3 kernel: {GENUINE}\n")
        await eventually(lambda: len(drained(engine)) == 1, what="the vouched-for drain")
        await eventually(
            lambda: agent.metrics.xid_untrusted.labels(f"file:{syslog}")._value.get() == 1, what="counted"
        )
    assert ["0000:5e:00.0" in r for r in drained(engine)] == [True]


def _journal_remote() -> str | None:
    path = "/lib/systemd/systemd-journal-remote"
    return path if os.path.exists(path) and shutil.which("journalctl") else None


def _export(entries: list[dict[str, str]]) -> bytes:
    return b"".join(b"".join(f"{k}={v}\n".encode() for k, v in entry.items()) + b"\n" for entry in entries)


async def test_journald_reads_only_what_the_kernel_wrote(tmp_path: Path) -> None:
    remote = _journal_remote()
    if remote is None:
        if real_components_required():
            pytest.fail("systemd-journal-remote and journalctl required under CI (Makefile DEBS)")
        pytest.skip("systemd-journal-remote not installed")
    boot = "0123456789abcdef0123456789abcdef"
    common = {"_BOOT_ID": boot, "_HOSTNAME": "gpu-3"}
    export = _export(
        [
            {"__REALTIME_TIMESTAMP": "1733300000000000", "__MONOTONIC_TIMESTAMP": "1000", **common,
             "_TRANSPORT": "syslog", "SYSLOG_IDENTIFIER": "kernel", "MESSAGE": FORGED},
            {"__REALTIME_TIMESTAMP": "1733300001000000", "__MONOTONIC_TIMESTAMP": "2000", **common,
             "_TRANSPORT": "kernel", "MESSAGE": GENUINE},
        ]
    )  # fmt: skip
    journal = tmp_path / "system.journal"
    await asyncio.to_thread(
        subprocess.run, [remote, "-o", str(journal), "-"], input=export, check=True, capture_output=True
    )
    cursor = tmp_path / "cursor"
    source = JournaldSource(files=[journal], cursor_file=cursor, from_start=True)
    lines: list[LogLine] = []

    async def read() -> None:
        async for line in source.lines():
            lines.append(line)

    task = asyncio.create_task(read())
    await eventually(lambda: len(lines) >= 1, what="the kernel's line")
    await asyncio.sleep(0.5)  # the forged one would come first, were it read at all
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [(line.text, line.trusted) for line in lines] == [(GENUINE, True)]
    assert cursor.read_text().strip() == lines[0].key.removeprefix("journal:")
    # a restart resumes after the cursor: nothing again
    again = JournaldSource(files=[journal], cursor_file=cursor)
    assert any(arg.startswith("--after-cursor=") for arg in again.command())


def test_a_journal_entry_without_the_kernel_transport_is_untrusted() -> None:
    line = line_of_entry(b'{"__CURSOR": "c1", "MESSAGE": "x", "_TRANSPORT": "stdout"}')
    assert line is not None and not line.trusted
    kernel = line_of_entry(b'{"__CURSOR": "c2", "MESSAGE": [78, 86, 255], "_TRANSPORT": "kernel"}')
    assert kernel is not None and kernel.trusted and kernel.text.startswith("NV")
    assert line_of_entry(b"not json") is None and line_of_entry(b'{"MESSAGE": "no cursor"}') is None
