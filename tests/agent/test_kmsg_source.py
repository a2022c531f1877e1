"""The kmsg reader, against a SOCK_SEQPACKET pair (one record per read, like /dev/kmsg) and the real
/dev/kmsg of this machine where it can be written (root)."""

import asyncio
import json
import os
import socket
import uuid
from pathlib import Path

import pytest

from tests.support import eventually
from watchd.sources.base import LogLine
from watchd.sources.kmsg import KmsgSource, current_boot_id


def record(seq: int, message: str, usec: int = 1_000_000, extra: str = "") -> bytes:
    return f"6,{seq},{usec},-;{message}\n{extra}".encode()


async def take(source: KmsgSource, n: int, timeout: float = 5.0) -> list[LogLine]:
    out: list[LogLine] = []

    async def run() -> None:
        async for line in source.lines():
            out.append(line)
            if len(out) == n:
                return

    await asyncio.wait_for(run(), timeout)
    return out


def pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.setblocking(False)
    return a, b


async def test_reads_records_and_counts_gaps() -> None:
    writer, reader = pair()
    lost: list[int] = []
    source = KmsgSource(opener=lambda: os.dup(reader.fileno()), on_lost=lost.append, boot_id="b1")
    for seq, text in [(10, "one"), (11, "two"), (15, "after a gap")]:
        writer.send(record(seq, text, extra=" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"))
    lines = await take(source, 3)
    assert [line.text for line in lines] == ["one", "two", "after a gap"]
    assert lost == [3] and source.lost == 3
    assert lines[0].key == "b1:10"
    writer.close()
    reader.close()


async def test_malformed_records_are_counted_and_skipped() -> None:
    writer, reader = pair()
    source = KmsgSource(opener=lambda: os.dup(reader.fileno()), boot_id="b1")
    writer.send(b"garbage without header")
    writer.send(record(1, "fine"))
    lines = await take(source, 1)
    assert [line.text for line in lines] == ["fine"] and source.malformed == 1
    writer.close()
    reader.close()


async def test_resumes_after_saved_seq_in_the_same_boot(tmp_path: Path) -> None:
    state = tmp_path / "kmsg.state"
    writer, reader = pair()
    first = KmsgSource(state_file=state, opener=lambda: os.dup(reader.fileno()), boot_id="b1")
    writer.send(record(1, "a"))
    writer.send(record(2, "b"))
    await take(first, 2)
    assert first.last_seq == 2
    writer.close()
    reader.close()
    # Restart: the kernel hands back the whole ring; records up to seq 2 were already read.
    writer, reader = pair()
    second = KmsgSource(state_file=state, opener=lambda: os.dup(reader.fileno()), boot_id="b1")
    for seq, text in [(1, "a"), (2, "b"), (3, "c")]:
        writer.send(record(seq, text))
    assert [line.text for line in await take(second, 1)] == ["c"]
    # Another boot: the saved sequence number is ignored.
    third = KmsgSource(state_file=state, opener=lambda: os.dup(reader.fileno()), boot_id="b2")
    writer.send(record(1, "new boot"))
    assert [line.text for line in await take(third, 1)] == ["new boot"]
    writer.close()
    reader.close()


def _kmsg_writable() -> bool:
    try:
        fd = os.open("/dev/kmsg", os.O_RDWR | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)
    return True


@pytest.mark.skipif(not _kmsg_writable(), reason="/dev/kmsg is not writable here (needs root)")
async def test_real_dev_kmsg_starts_at_end_and_sees_new_records(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"watchd-test before {marker}\n")
    source = KmsgSource(Path("/dev/kmsg"), tmp_path / "state", boot_id=current_boot_id())
    got: list[str] = []

    async def run() -> None:
        async for line in source.lines():
            if marker in line.text:
                got.append(line.text)
                return

    task = asyncio.create_task(run())
    await asyncio.sleep(0.2)
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"watchd-test after {marker}\n")
    await asyncio.wait_for(task, 5)
    assert got == [f"watchd-test after {marker}"]
    assert (tmp_path / "state").exists()


async def test_held_records_keep_the_resume_point_before_them_until_acknowledged() -> None:
    writer, reader = pair()
    source = KmsgSource(opener=lambda: os.dup(reader.fileno()), boot_id="b1")
    for seq in (4, 5, 6, 7):
        writer.send(record(seq, f"line {seq}"))
    lines = await take(source, 4)
    assert source.resume_seq == 7
    source.hold(lines[0])
    source.hold(lines[3])
    assert source.resume_seq == 3
    source.ack(lines[0])
    assert source.resume_seq == 6
    source.ack(lines[3])
    assert source.resume_seq == 7
    source.hold(LogLine("no record", 0.0, "k"))  # a line without a sequence number holds nothing
    assert source.resume_seq == 7
    writer.close()
    reader.close()


async def test_an_agent_restart_re_reads_records_whose_events_were_not_delivered(tmp_path: Path) -> None:
    """The engine is down; the agent reads an Xid, cannot ship it, stops: the next agent reads it again."""
    from tests.agent.test_agent import agent_config, engine_config, free_port
    from watchd.agent.runner import Agent
    from watchd.engine.runner import Engine

    port = free_port()
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus."
    state = tmp_path / "kmsg.state"

    def agent(reader: socket.socket) -> Agent:
        source = KmsgSource(state_file=state, opener=lambda: os.dup(reader.fileno()), boot_id="boot-1")
        return Agent(agent_config(port), sources=[source])

    writer, reader = pair()
    for seq, text in [(1, "booting"), (2, xid), (3, "later line")]:
        writer.send(record(seq, text))
    async with agent(reader) as first:
        await asyncio.sleep(0.3)  # read, queued, the engine unreachable
        assert len(first.shipper) == 1
    assert json.loads(state.read_text())["seq"] == 1, "the Xid's record is not settled"
    writer.close()
    reader.close()

    writer, reader = pair()  # the kernel hands back the whole ring to a new reader
    for seq, text in [(1, "booting"), (2, xid), (3, "later line")]:
        writer.send(record(seq, text))
    async with Engine(engine_config(port), use_config_scheduler=False) as engine, agent(reader):
        await eventually(
            lambda: engine.metrics.events_received.labels("kmsg", "xid")._value.get() == 1,
            what="the Xid delivered after the restart",
        )
        await asyncio.sleep(0.2)
    assert json.loads(state.read_text())["seq"] == 3
    writer.close()
    reader.close()
