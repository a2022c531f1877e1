"""Heartbeats: the report validation, the coalescer (injected clock), and the stdlib client against a real
agent endpoint on a Unix socket and on loopback HTTP."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.harness.ports import free_port
from tests.support import eventually
from watchd.agent.heartbeat import Coalescer, ReportError, parse_report
from watchd.agent.heartbeat_server import HeartbeatServer
from watchd.agent.metrics import AgentMetrics
from watchd.agent.settings import HeartbeatConfig
from watchd.client import Heartbeat
from watchd.clock import FakeClock, SystemClock
from watchd.model.events import Event


def test_reports_are_validated_strictly() -> None:
    r = parse_report({"job": "42", "rank": 3, "step": 7, "collective_seq": 9, "phase": "eval"}, 100.0)
    assert (r.job, r.rank, r.step, r.collective_seq, r.phase, r.time) == ("42", 3, 7, 9, "eval", 100.0)
    for bad, field in (
        ({"job": "42", "rank": 0, "step": 1, "bogus": 1}, "bogus"),
        ({"job": "42", "rank": -1, "step": 1}, "rank"),
        ({"job": "42", "rank": 0}, "step"),
        ({"job": "42", "rank": True, "step": 1}, "rank"),
        ({"job": "42", "rank": 0, "step": 1, "phase": "Not A Phase"}, "phase"),
        ({"rank": 0, "step": 1}, "job"),
    ):
        with pytest.raises(ReportError, match=field):
            parse_report(bad, 100.0)


def test_coalescer_forwards_changes_at_most_once_per_interval_and_phase_changes_at_once() -> None:
    clock = FakeClock()
    c = Coalescer("gpu-1", clock, forward_interval_s=2.0)

    def report(step: int, phase: str = "train") -> list[Event]:
        out = c.offer(parse_report({"job": "42", "rank": 0, "step": step, "phase": phase}, clock.now()))
        assert out is not None
        return out

    first = report(1)
    assert [e.attrs["step"] for e in first] == [1]  # a rank's first report goes at once
    clock.advance(0.5)
    assert report(2) == [] and report(3) == []  # coalesced
    assert c.due() == []
    clock.advance(1.6)
    [due] = c.due()
    assert due.kind == "heartbeat" and due.attrs["step"] == 3 and due.attrs["reports"] == 2
    assert c.due() == []  # nothing changed since
    [phase] = report(3, "checkpoint")  # a phase change is not held back
    assert phase.attrs["phase"] == "checkpoint" and phase.node == "gpu-1" and phase.source == "heartbeat"


def test_coalescer_refuses_ranks_beyond_its_capacity() -> None:
    c = Coalescer("gpu-1", FakeClock(), max_ranks=2)
    assert c.offer(parse_report({"job": "a", "rank": 0, "step": 1}, 0.0))
    assert c.offer(parse_report({"job": "a", "rank": 1, "step": 1}, 0.0))
    assert c.offer(parse_report({"job": "a", "rank": 2, "step": 1}, 0.0)) is None


@pytest.mark.parametrize("transport", ["socket", "http"])
async def test_client_reports_reach_the_agent_endpoint(transport: str, tmp_path: Path) -> None:
    sock = tmp_path / "hb" / "heartbeat.sock"
    config = HeartbeatConfig(
        enabled=True,
        socket=sock if transport == "socket" else None,
        http_port=0 if transport == "socket" else free_port(),
        verify=False,  # the mechanics of the transport; who may report: tests/security/
        forward_interval_s=0.2,
    )
    shipped: list[Event] = []
    server = HeartbeatServer(config, "gpu-7", SystemClock(), AgentMetrics(), shipped.append)
    metrics = server._metrics
    await server.start()
    assert metrics.heartbeat_endpoint_up.labels(transport)._value.get() == 1
    try:
        hb = Heartbeat(
            "slurm:99",
            5,
            socket_path=str(sock) if transport == "socket" else None,
            port=config.http_port if transport == "http" else None,
            report_done_at_exit=False,
        )
        hb.step(1, step_time=0.5, compute_time=0.3, collective_seq=4)
        await eventually(lambda: bool(shipped), timeout=10, what="a heartbeat event shipped")
        hb.close()
    finally:
        await server.stop()
    assert shipped, "no heartbeat event reached the shipper"
    e = shipped[0]
    assert (e.kind, e.node, e.attrs["job"], e.attrs["rank"], e.attrs["step"]) == (
        "heartbeat",
        "gpu-7",
        "slurm:99",
        5,
        1,
    )
    assert e.attrs["collective_seq"] == 4 and e.attrs["compute_time_s"] == 0.3


async def test_client_falls_back_to_loopback_when_the_socket_cannot_be_used(tmp_path: Path) -> None:
    stale = tmp_path / "heartbeat.sock"
    stale.write_text("")  # a path that exists but where nothing listens (or that the rank may not open)
    config = HeartbeatConfig(socket=None, http_port=free_port(), forward_interval_s=0.2, verify=False)
    shipped: list[Event] = []
    server = HeartbeatServer(config, "gpu-7", SystemClock(), AgentMetrics(), shipped.append)
    await server.start()
    try:
        hb = Heartbeat("slurm:5", 1, socket_path=str(stale), port=config.http_port, report_done_at_exit=False)
        hb.step(1)
        await eventually(lambda: bool(shipped), timeout=10, what="a heartbeat over loopback")
        await asyncio.to_thread(hb.close)  # not on the loop: the agent must answer the last report
    finally:
        await server.stop()
    assert hb.dropped == 0 and shipped[0].attrs["rank"] == 1


async def test_client_sends_one_request_per_interval_carrying_every_report(tmp_path: Path) -> None:
    sock = tmp_path / "heartbeat.sock"
    config = HeartbeatConfig(socket=sock, http_port=0, forward_interval_s=0.2, verify=False)
    shipped: list[Event] = []
    server = HeartbeatServer(config, "gpu-7", SystemClock(), AgentMetrics(), shipped.append)
    accepted = server._metrics.heartbeats.labels("accepted")
    await server.start()
    try:
        hb = Heartbeat("slurm:8", 2, socket_path=str(sock), send_interval=0.5, report_done_at_exit=False)
        for step in range(1, 41):  # 40 steps in a burst: the first goes at once, the rest wait together
            hb.step(step)
        await eventually(lambda: hb.sent == 40, timeout=10, what="all 40 reports delivered")
        assert accepted._value.get() == 40 and hb.dropped == 0
        assert 1 <= hb.requests <= 3, hb.requests  # not one request per report
        await eventually(lambda: any(e.attrs["step"] == 40 for e in shipped), timeout=10, what="step 40")
        await asyncio.to_thread(hb.close)
    finally:
        await server.stop()


def test_client_never_blocks_without_an_agent(tmp_path: Path) -> None:
    hb = Heartbeat("slurm:1", 0, socket_path=str(tmp_path / "none.sock"), report_done_at_exit=False)
    started = time.monotonic()
    for step in range(1000):
        hb.step(step)
    assert time.monotonic() - started < 1.0  # a thousand calls, no agent: nothing waits on I/O
    hb.close(timeout=0.5)


@pytest.mark.real
def test_client_imports_only_the_standard_library() -> None:
    code = (
        "import sys, watchd.client; "
        "heavy = ('aiohttp', 'pydantic', 'yaml', 'prometheus_client', 'structlog'); "
        "bad = [m for m in heavy if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(
    ("mode", "socket_bits", "folder_bits"), [("0660", 0o660, 0o750), ("666", 0o666, 0o751)]
)
async def test_socket_and_its_new_folder_get_the_configured_permissions(
    mode: str, socket_bits: int, folder_bits: int, tmp_path: Path
) -> None:
    sock = tmp_path / "run" / "heartbeat.sock"
    config = HeartbeatConfig(socket=sock, socket_mode=mode, http_port=0)
    server = HeartbeatServer(config, "gpu-7", SystemClock(), AgentMetrics(), lambda e: None)
    await server.start()
    try:
        assert stat.S_IMODE(os.stat(sock).st_mode) == socket_bits
        assert stat.S_IMODE(os.stat(sock.parent).st_mode) == folder_bits
    finally:
        await server.stop()
    assert not sock.exists()  # removed at stop


def test_socket_mode_is_validated() -> None:
    with pytest.raises(ValidationError):
        HeartbeatConfig(socket_mode="0999")
    with pytest.raises(ValidationError):
        HeartbeatConfig(socket_group="no spaces")
    with pytest.raises(ValidationError):
        HeartbeatConfig(socket_group=-1)


def test_by_default_every_local_user_may_connect_and_reports_are_checked() -> None:
    """A job's ranks run as its user, not the agent's: the socket is open to them, the peer check decides."""
    assert HeartbeatConfig().verify and HeartbeatConfig().socket_permissions == 0o666
    assert HeartbeatConfig(verify=False).socket_permissions == 0o660
    assert HeartbeatConfig(socket_mode="0600").socket_permissions == 0o600


@pytest.mark.parametrize("by", ["name", "gid"])
async def test_socket_group_by_name_or_gid(by: str, tmp_path: Path) -> None:
    import grp

    gid = os.getgid()
    group: str | int = grp.getgrgid(gid).gr_name if by == "name" else gid
    sock = tmp_path / "run" / "heartbeat.sock"
    config = HeartbeatConfig(socket=sock, socket_mode="0660", socket_group=group, http_port=0)
    metrics = AgentMetrics()
    server = HeartbeatServer(config, "gpu-7", SystemClock(), metrics, lambda e: None)
    await server.start()
    try:
        assert os.stat(sock).st_gid == gid and stat.S_IMODE(os.stat(sock).st_mode) == 0o660
        assert os.stat(sock.parent).st_gid == gid
        assert metrics.heartbeat_endpoint_up.labels("socket")._value.get() == 1
    finally:
        await server.stop()


async def test_an_unknown_socket_group_is_named_and_the_endpoint_is_down(tmp_path: Path) -> None:
    from watchd.agent.heartbeat_server import socket_group_id

    with pytest.raises(OSError, match=r"heartbeat.socket_group: no group 'no-such-group-x' on this host"):
        socket_group_id("no-such-group-x")
    sock = tmp_path / "heartbeat.sock"
    config = HeartbeatConfig(socket=sock, socket_group="no-such-group-x", http_port=0)
    metrics = AgentMetrics()
    server = HeartbeatServer(config, "gpu-7", SystemClock(), metrics, lambda e: None)
    await server.start()
    try:
        assert not sock.exists() and metrics.heartbeat_endpoint_up.labels("socket")._value.get() == 0
    finally:
        await server.stop()


def test_agent_check_names_an_unknown_socket_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from watchd.cli import main

    config = tmp_path / "agent.yaml"
    config.write_text("engine: {auth: {token: x}}\nheartbeat: {socket_group: no-such-group-x}\n")
    assert main(["agent", "--config", str(config), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{config}: heartbeat.socket_group: no group 'no-such-group-x' on this host" in err


async def test_client_keeps_reports_while_the_agent_is_away_and_sends_them_when_it_returns(
    tmp_path: Path,
) -> None:
    # a failed request (no agent yet, a timeout, a kept-alive connection the agent closed) puts its reports
    # back in the queue: they go with the next try instead of being lost
    sock = tmp_path / "heartbeat.sock"
    config = HeartbeatConfig(socket=sock, http_port=0, forward_interval_s=0.2, verify=False)
    shipped: list[Event] = []
    hb = Heartbeat("slurm:9", 0, socket_path=str(sock), queue_size=8, report_done_at_exit=False)
    for step in range(1, 6):
        hb.step(step)
    await asyncio.sleep(0.3)  # the first request fails: nothing listens yet
    assert hb.sent == 0 and hb.dropped == 0
    server = HeartbeatServer(config, "gpu-7", SystemClock(), AgentMetrics(), shipped.append)
    await server.start()
    try:
        await eventually(lambda: hb.sent == 5, timeout=10, what="the 5 queued reports, once the agent is up")
        assert hb.dropped == 0
        for step in range(6, 30):  # more than the queue holds while the back-off runs: the oldest counted
            hb.step(step)
        await eventually(lambda: any(e.attrs["step"] == 29 for e in shipped), timeout=10, what="step 29")
        assert hb.sent + hb.dropped == 29
        await asyncio.to_thread(hb.close)
    finally:
        await server.stop()
