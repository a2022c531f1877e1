"""The agent's port collector: built by name from the config, scanning in a thread at its interval, the
metrics Prometheus scrapes, a node without InfiniBand, and a real agent shipping a down port to a real
engine."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.ib.tree import NODE_EXPORTER, copy_recorded, ndr_node, port, write
from tests.support import eventually, real_components_required
from watchd.agent.metrics import AgentMetrics
from watchd.agent.runner import Agent
from watchd.agent.settings import EngineEndpoint, HeartbeatConfig, ShipperConfig
from watchd.clock import FakeClock
from watchd.config import AgentConfig, EngineConfig
from watchd.credentials import TokenSource
from watchd.engine.runner import Engine
from watchd.errors import ConfigError
from watchd.http_settings import Listen
from watchd.ib.collector import IbPortSource
from watchd.ib.metrics import IbPortCollector
from watchd.ib.settings import IbConfig
from watchd.model.ib import IbPortHealth
from watchd.sources.registry import EVENT_SOURCES, SourceContext, event_sources_from_config
from watchd.sources.settings import KmsgConfig, SourcesConfig


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_collector_is_registered_by_name_and_on_by_default(tmp_path: Path) -> None:
    assert "ib-ports" in EVENT_SOURCES
    [source] = event_sources_from_config(SourcesConfig(), SourceContext(node="gpu-1"))
    assert isinstance(source, IbPortSource) and source.config.root == Path("/sys/class/infiniband")
    assert source.config.interval_s == 15.0
    off = SourcesConfig(ib=IbConfig(enabled=False))
    assert event_sources_from_config(off, SourceContext(node="gpu-1")) == []
    with pytest.raises(ConfigError, match="no event source named 'rocm'"):
        event_sources_from_config(SourcesConfig(), SourceContext(), names=["rocm"])


def test_config_is_strict() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        IbConfig(interval_s=0.1)
    with pytest.raises(ValueError, match="error_thresholds"):
        IbConfig(error_thresholds={"symbol_error": -1})
    merged = IbConfig(error_thresholds={"symbol_error": 20, "link_downed": 0}).error_thresholds
    assert merged["symbol_error"] == 20 and "link_downed" not in merged and merged["link_error_recovery"] == 5
    with pytest.raises(ValueError, match="extra"):
        IbConfig.model_validate({"intervall_s": 30})
    config = IbConfig(error_thresholds={"rnr_nak_retry_err": 1}, hw_counters=[])
    assert config.hw_counters_read() == ("rnr_nak_retry_err",)


def test_a_scan_feeds_the_metrics(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 2)
    metrics = AgentMetrics()
    clock = FakeClock()
    source = IbPortSource(
        "gpu-1",
        IbConfig(root=root),
        clock=clock,
        collector=metrics.ib_ports,
        on_scan=metrics.ib_scanned,
        on_unreadable=metrics.ib_unreadable.inc,
    )
    assert source.observe(source.scan()) == []
    write(port(root, "mlx5_1") / "state", "1: DOWN")
    write(port(root, "mlx5_1") / "phys_state", "3: Disabled")
    (port(root, "mlx5_0") / "counters" / "port_rcv_errors").unlink()
    (port(root, "mlx5_0") / "counters" / "port_rcv_errors").mkdir()  # unreadable
    clock.advance(15)
    [down] = [IbPortHealth.read(e) for e in source.observe(source.scan())]
    assert down is not None and (down.device, down.condition) == ("mlx5_1", "port_down")
    got = samples(metrics.registry)

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert value("watchd_ib_port_up", device="mlx5_0", port="1") == 1
    assert value("watchd_ib_port_up", device="mlx5_1", port="1") == 0
    assert value("watchd_ib_port_state", device="mlx5_1", port="1") == 1
    assert value("watchd_ib_port_phys_state", device="mlx5_1", port="1") == 3
    assert value("watchd_ib_port_rate_gbps", device="mlx5_0", port="1") == 400
    assert value("watchd_ib_port_reference_rate_gbps", device="mlx5_0", port="1") == 400
    assert value("watchd_ib_port_condition", device="mlx5_1", port="1", condition="port_down") == 1
    info = dict(device="mlx5_0", port="1", link_layer="InfiniBand", hca_type="MT4129")
    assert value("watchd_ib_port_info", **info) == 1
    assert value("watchd_ib_port_errors_total", device="mlx5_1", port="1", counter="symbol_error") == 0
    assert (
        value("watchd_ib_port_errors_total", device="mlx5_0", port="1", counter="local_ack_timeout_err")
        == 131
    )
    assert (
        "watchd_ib_port_errors_total",
        (("counter", "port_rcv_errors"), ("device", "mlx5_0"), ("port", "1")),
    ) not in got
    assert value("watchd_agent_ib_scans_total", outcome="ok") == 2
    assert value("watchd_agent_ib_files_unreadable_total") == 1
    assert value("watchd_agent_ib_scan_cpu_seconds_total") > 0


def test_the_metrics_pass_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if real_components_required():
            pytest.fail("promtool is required under CI")
        pytest.skip("promtool not installed")
    root = ndr_node(tmp_path, 2)
    metrics = AgentMetrics()
    source = IbPortSource("n", IbConfig(root=root), collector=metrics.ib_ports, on_scan=metrics.ib_scanned)
    source.observe(source.scan())
    write(port(root, "mlx5_1") / "state", "1: DOWN")
    source.observe(source.reader.scan(2e9))
    text = generate_latest(metrics.registry)
    assert b"watchd_ib_port_errors_total{" in text and b'condition="port_down"' in text
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, check=False)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_the_recorded_saturated_counter_shows_in_the_metrics() -> None:
    collector = IbPortCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    source = IbPortSource("n", IbConfig(root=NODE_EXPORTER), collector=collector)
    source.observe(source.scan())
    got = samples(registry)
    key = (
        "watchd_ib_port_errors_saturated",
        (("counter", "port_xmit_wait"), ("device", "mlx4_0"), ("port", "1")),
    )
    # port_xmit_wait is read only when a threshold names it; the error counters are not saturated
    assert key not in got
    source = IbPortSource(
        "n", IbConfig(root=NODE_EXPORTER, error_thresholds={"port_xmit_wait": 1000}), collector=collector
    )
    source.observe(source.scan())
    assert samples(registry)[key] == 1


def test_no_infiniband_is_said_once_and_again_when_it_appears(tmp_path: Path) -> None:
    root = tmp_path / "sys" / "class" / "infiniband"
    metrics = AgentMetrics()
    source = IbPortSource("gpu-1", IbConfig(root=root), clock=FakeClock(), on_scan=metrics.ib_scanned)
    with structlog.testing.capture_logs() as logs:
        for _ in range(5):
            assert source.observe(source.scan()) == []
        copy_recorded(tmp_path, NODE_EXPORTER)
        assert source.observe(source.scan()) == []
    assert [e["event"] for e in logs] == ["ib_absent", "ib_present"]
    assert metrics.ib_scans.labels("absent")._value.get() == 5


async def test_the_source_scans_at_its_interval_in_a_thread(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 1)
    source = IbPortSource("gpu-1", IbConfig(root=root, interval_s=1.0))
    got: list[IbPortHealth] = []

    async def pump() -> None:
        async for event in source.events():
            h = IbPortHealth.read(event)
            assert h is not None
            got.append(h)

    task = asyncio.create_task(pump())
    try:
        await eventually(lambda: source.scans >= 1, what="the first scan")
        write(port(root, "mlx5_0") / "state", "1: DOWN")
        await eventually(lambda: len(got) == 1, timeout=5, what="the port down")
        assert source.scans == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert got[0].condition == "port_down"


async def test_an_agent_ships_a_down_port_to_the_engine(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 2)
    engine_config = EngineConfig(listen=Listen(port=0), auth=TokenSource(token="tok"), mode="dry-run")
    async with Engine(engine_config, use_config_scheduler=False) as engine:
        config = AgentConfig(
            node="gpu-3",
            engine=EngineEndpoint(url=f"http://127.0.0.1:{engine.port}", auth=TokenSource(token="tok")),
            listen=Listen(port=0),
            sources=SourcesConfig(kmsg=KmsgConfig(enabled=False), ib=IbConfig(root=root, interval_s=1.0)),
            heartbeat=HeartbeatConfig(enabled=False),
            shipper=ShipperConfig(backoff_initial_s=0.05, backoff_max_s=0.2, shutdown_flush_s=0.2),
        )
        async with Agent(config, sources=[]) as agent:
            received = engine.metrics.events_received.labels("ib-sysfs", "ib_port_health")
            await eventually(lambda: agent.metrics.ib_scans.labels("ok")._value.get() >= 1, what="a scan")
            write(port(root, "mlx5_1") / "state", "1: DOWN")
            write(port(root, "mlx5_1") / "phys_state", "3: Disabled")
            await eventually(lambda: received._value.get() == 1, timeout=10, what="the event at the engine")
            assert agent.metrics.events.labels("ib-sysfs", "ib_port_health")._value.get() == 1
