"""Agent to engine over real HTTP on loopback: delivery, outage and recovery, overflow, rejection."""

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.harness.ports import free_port
from tests.support import XID79, eventually, scheduler_actions
from watchd.agent.runner import Agent
from watchd.agent.settings import EngineEndpoint, HeartbeatConfig, ShipperConfig
from watchd.config import AgentConfig, EngineConfig
from watchd.credentials import TokenSource
from watchd.engine.runner import Engine
from watchd.http_settings import Listen
from watchd.model.events import Event, WireError, event_from_wire, fit_to_wire
from watchd.sources.base import FakeLogSource, LogLine, NothingToAcknowledge
from watchd.sources.settings import SourcesConfig


def engine_config(port: int, token: str = "tok") -> EngineConfig:
    return EngineConfig(listen=Listen(port=port), auth=TokenSource(token=token), mode="dry-run")


def agent_config(port: int, token: str = "tok", **shipper: object) -> AgentConfig:
    return AgentConfig(
        node="gpu-3",
        engine=EngineEndpoint(url=f"http://127.0.0.1:{port}", auth=TokenSource(token=token), timeout_s=2),
        listen=Listen(port=0),
        sources=SourcesConfig(),
        heartbeat=HeartbeatConfig(enabled=False),
        # no spool unless a test gives one: what a stop could not deliver is counted as lost
        shipper=ShipperConfig(
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
            shutdown_flush_s=0.2,
            **{"spool_file": None, **shipper},  # type: ignore[arg-type]
        ),
    )


def xid_lines(n: int) -> str:
    return "\n".join(
        f"NVRM: Xid (PCI:0000:{i % 256:02x}:00): 13, pid={i}, name=python3, Graphics Exception"
        for i in range(n)
    )


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    async with Engine(engine_config(0), use_config_scheduler=False) as e:
        yield e


def received(engine: Engine) -> float:
    return engine.metrics.events_received.labels("kmsg", "xid")._value.get()


async def test_xid_line_becomes_an_event_at_the_engine(engine: Engine) -> None:
    source = FakeLogSource("kmsg")
    async with Agent(agent_config(engine.port), sources=[source]) as agent:
        source.inject_log("some unrelated kernel line\n" + XID79)
        await eventually(lambda: len(scheduler_actions(engine.audit.entries)) == 2, what="decisions")
        # the engine answers once the batch is evaluated: the agent counts it shipped after the decisions
        await eventually(lambda: agent.metrics.shipped._value.get() >= 1, what="the reply")
        assert agent.metrics.shipped._value.get() == 1
    drain = scheduler_actions(engine.audit.entries)[0]
    assert (drain.node, drain.action, drain.outcome) == ("gpu-3", "drain", "dry_run")
    assert drain.params["reason"] == "Xid79 3b:00 GPU has fallen off the bus (GPU 0000:3b:00.0)"


async def test_unusable_heartbeat_endpoints_are_logged_and_counted_and_the_agent_runs_on(
    engine: Engine, tmp_path: Path
) -> None:
    (tmp_path / "not-a-folder").write_text("")
    with socket.socket() as busy:  # the loopback port taken by another process
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        config = agent_config(engine.port).model_copy(
            update={
                "heartbeat": HeartbeatConfig(
                    socket=tmp_path / "not-a-folder" / "heartbeat.sock",
                    http_port=busy.getsockname()[1],
                    verify=False,
                )
            }
        )
        source = FakeLogSource("kmsg")
        async with Agent(config, sources=[source]) as agent:
            endpoint_up = agent.metrics.heartbeat_endpoint_up
            assert endpoint_up.labels("socket")._value.get() == 0
            assert endpoint_up.labels("http")._value.get() == 0
            assert agent.metrics.source_up.labels("heartbeat")._value.get() == 0
            source.inject_log(XID79)  # the rest of the agent is unaffected
            await eventually(lambda: received(engine) == 1, what="the Xid shipped")


async def test_events_wait_for_the_engine_and_are_delivered_when_it_returns() -> None:
    port = free_port()
    source = FakeLogSource("kmsg")
    async with Agent(agent_config(port), sources=[source]) as agent:
        source.inject_log(xid_lines(50))
        await eventually(
            lambda: agent.metrics.requests.labels("unreachable")._value.get() >= 2, what="failed attempts"
        )
        assert len(agent.shipper) == 50
        assert agent.metrics.engine_up._value.get() == 0
        async with Engine(engine_config(port), use_config_scheduler=False) as engine:
            await eventually(lambda: received(engine) == 50, what="delivery after outage")
            # the engine counts a batch before it answers; the agent lets go of it once the answer is read
            await eventually(lambda: len(agent.shipper) == 0, what="the agent's queue emptied")
            assert received(engine) == 50  # nothing sent twice
            assert agent.metrics.dropped.labels("queue_full")._value.get() == 0


async def test_overflow_is_counted_never_silent(engine: Engine) -> None:
    port = free_port()  # nobody listens: everything queues
    source = FakeLogSource("kmsg")
    async with Agent(agent_config(port, queue_size=10), sources=[source]) as agent:
        source.inject_log(xid_lines(25))
        await eventually(
            lambda: agent.metrics.events.labels("kmsg", "xid")._value.get() == 25, what="events parsed"
        )
        assert len(agent.shipper) == 10
        assert agent.metrics.dropped.labels("queue_full")._value.get() == 15
        shutdown_loss = agent.metrics.dropped.labels("shutdown")
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{agent.port}/healthz") as r:
            assert (await r.json())["dropped"] == 15
    assert shutdown_loss._value.get() == 10  # what could not be delivered at exit is counted too


async def test_wrong_token_keeps_events_queued(engine: Engine) -> None:
    source = FakeLogSource("kmsg")
    async with Agent(agent_config(engine.port, token="wrong"), sources=[source]) as agent:
        source.inject_log(XID79)
        await eventually(lambda: agent.metrics.requests.labels("unauthorized")._value.get() >= 1, what="401")
        assert len(agent.shipper) == 1 and not engine.audit.entries


async def test_large_backlog_is_shipped_in_batches(engine: Engine) -> None:
    source = FakeLogSource("kmsg")
    async with Agent(agent_config(engine.port, max_batch=100), sources=[source]) as agent:
        source.inject_log(xid_lines(1000))
        await eventually(lambda: received(engine) == 1000, what="1000 events")
        delivered = agent.metrics.requests.labels("delivered")
        # the engine counts a batch as it arrives and answers once it is evaluated: the last reply may lag
        await eventually(lambda: delivered._value.get() >= 10, what="10 batches acknowledged")


async def test_failing_source_is_restarted_and_counted(engine: Engine) -> None:
    class Broken(NothingToAcknowledge):
        name = "broken"
        calls = 0

        async def lines(self):  # type: ignore[no-untyped-def]
            Broken.calls += 1
            raise OSError("cannot open /dev/kmsg")
            yield  # pragma: no cover

    async with Agent(agent_config(engine.port), sources=[Broken()]) as agent:
        await eventually(lambda: agent.metrics.source_errors.labels("broken")._value.get() >= 1, what="error")
        assert agent.metrics.source_up.labels("broken")._value.get() == 0
        await asyncio.sleep(0)


async def test_a_huge_log_line_is_cut_to_the_wire_limit_and_delivered_with_its_batch(engine: Engine) -> None:
    source = FakeLogSource("kmsg")
    long_line = "NVRM: Xid (PCI:0000:07:00): 13, pid=7, name=python3, Graphics Exception " + "x" * 20_000
    async with Agent(agent_config(engine.port), sources=[source]) as agent:
        source.inject_log("\n".join([*xid_lines(2).splitlines(), long_line, xid_lines(3).splitlines()[2]]))
        await eventually(lambda: received(engine) == 4, what="all four events")
        assert agent.metrics.dropped.labels("invalid")._value.get() == 0


def test_fit_to_wire_cuts_only_what_the_wire_refuses() -> None:
    short = Event("a", "gpu-1", "kmsg", "xid", 1.0, {"xid": 13, "message": "ok"})
    assert fit_to_wire(short) is short
    long = Event("b", "gpu-1", "kmsg", "xid", 1.0, {"xid": 13, "message": "y" * 20_000, "process": "p"})
    cut = fit_to_wire(long)
    assert cut.attrs["truncated"] is True and cut.attrs["xid"] == 13 and cut.attrs["process"] == "p"
    assert str(cut.attrs["message"]).startswith("y" * 100) and str(cut.attrs["message"]).endswith(
        "chars cut]"
    )
    event_from_wire(cut.to_wire(), "events[0]")  # now valid on the wire
    with pytest.raises(WireError):
        event_from_wire(long.to_wire(), "events[0]")


class AcknowledgedSource(FakeLogSource):
    """Records what the agent holds and acknowledges."""

    def __init__(self) -> None:
        super().__init__("kmsg")
        self.held: list[str] = []
        self.acked: list[str] = []

    def hold(self, line: LogLine) -> None:
        self.held.append(line.text)

    def ack(self, line: LogLine) -> None:
        self.acked.append(line.text)


async def test_each_delivered_event_is_acknowledged_to_the_source_it_was_read_from(engine: Engine) -> None:
    source = AcknowledgedSource()
    async with Agent(agent_config(engine.port), sources=[source]):
        source.inject_log("some unrelated kernel line\n" + XID79)
        await eventually(lambda: source.acked == [XID79], what="the Xid's line acknowledged")
        assert source.held == [XID79]  # only lines events were read from


async def test_an_event_the_full_queue_refused_is_never_acknowledged() -> None:
    port = free_port()
    source = AcknowledgedSource()
    async with Agent(agent_config(port, queue_size=1), sources=[source]) as agent:
        source.inject_log(xid_lines(3))
        await eventually(lambda: len(source.held) == 3, what="three events read")
        assert len(agent.shipper) == 1 and source.acked == []
        async with Engine(engine_config(port), use_config_scheduler=False):
            await eventually(lambda: len(source.acked) == 1, what="the queued one delivered")
            assert source.acked == source.held[:1]


async def test_what_a_stop_could_not_deliver_is_spooled_and_delivered_after_the_next_start(
    tmp_path: Path,
) -> None:
    spool = tmp_path / "spool.jsonl"
    source = FakeLogSource("kmsg")
    async with Agent(agent_config(free_port(), spool_file=spool), sources=[source]) as agent:  # engine down
        source.inject_log(xid_lines(5))
        await eventually(lambda: len(agent.shipper) == 5, what="events queued")
    assert agent.metrics.dropped.labels("shutdown")._value.get() == 0
    assert len(spool.read_text().splitlines()) == 5
    assert spool.stat().st_mode & 0o777 == 0o600

    async with (
        Engine(engine_config(0), use_config_scheduler=False) as engine,
        Agent(agent_config(engine.port, spool_file=spool), sources=[FakeLogSource("kmsg")]),
    ):
        await eventually(lambda: received(engine) == 5, what="the spooled events delivered")
        await eventually(lambda: not spool.exists(), what="the spool removed once delivered")
