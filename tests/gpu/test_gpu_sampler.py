"""The agent's GPU loop over the fake backend: events, metrics, lost GPUs, MIG, NVML Xids, no driver."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import aiohttp
import pytest

from tests.support import eventually
from watchd.agent.runner import Agent
from watchd.agent.settings import EngineEndpoint, HeartbeatConfig
from watchd.agent.xid_dedup import XidDeduplicator
from watchd.clock import FakeClock
from watchd.config import AgentConfig
from watchd.gpu.backend import XidNotice
from watchd.gpu.metrics import GpuCollector, dcgm_mapping_markdown
from watchd.gpu.model import BackendUnavailable, GpuIdentity
from watchd.gpu.sampler import GpuSampler
from watchd.gpu.settings import GpuSourceConfig
from watchd.http_settings import Listen
from watchd.model.events import Event
from watchd.sim.gpu import FakeGpuBackend
from watchd.sim.scenario import EccDbe, FallOffBus, Scenario, XidFault
from watchd.sources.settings import SourcesConfig

START = 1_800_000_000.0
SCENARIOS = Path(__file__).parent.parent / "gpu_scenarios"


def rounds(sampler: GpuSampler, backend: FakeGpuBackend, seconds: range) -> None:
    for t in seconds:
        sampler.observe(sampler._sample_all(START + t))


def make(scenario: Scenario) -> tuple[GpuSampler, FakeGpuBackend, list[Event], list[str]]:
    lines: list[str] = []
    backend = FakeGpuBackend(scenario, START, on_kernel_log=lines.append)
    events: list[Event] = []
    sampler = GpuSampler(backend, "gpu-node-1", events.append, collector=GpuCollector(), summary_window_s=5)
    sampler.gpus = backend.open()
    return sampler, backend, events, lines


def health(events: list[Event], condition: str) -> list[Event]:
    return [e for e in events if e.kind == "gpu_health" and e.attrs["condition"] == condition]


def test_a_healthy_node_gives_summaries_and_no_health_events() -> None:
    sampler, _, events, lines = make(Scenario.training(gpus=8))
    rounds(sampler, _, range(0, 60, 2))
    assert not [e for e in events if e.kind == "gpu_health"] and not lines
    summaries = [e for e in events if e.kind == "gpu_summary"]
    assert len(summaries) == 8 * 11  # one per GPU per closed 5 s window (the 12th is still open)
    assert all(80 <= float(e.attrs["util_mean"]) <= 100 for e in summaries)  # type: ignore[arg-type]


def test_ecc_dbe_fires_once_names_the_gpu_and_writes_the_kernel_lines() -> None:
    sampler, backend, events, lines = make(Scenario.training(gpus=8, faults=[EccDbe(at=30, gpu=3)]))
    rounds(sampler, backend, range(0, 40, 2))
    (dbe,) = health(events, "ecc_dbe")
    gpu3 = backend.gpus[3]
    assert (dbe.attrs["gpu"], dbe.attrs["uuid"], dbe.attrs["pci_bus_id"]) == (3, gpu3.uuid, gpu3.pci_bus_id)
    assert dbe.time >= START + 30 and "uncorrectable ECC" in str(dbe.attrs["evidence"])
    assert any("Xid" in line and ": 48," in line for line in lines)


def test_a_gpu_lost_mid_run_is_one_event_and_the_others_go_on() -> None:
    sampler, backend, events, _ = make(Scenario.training(gpus=4, faults=[FallOffBus(at=10, gpu=1)]))
    rounds(sampler, backend, range(0, 30, 2))
    (lost,) = health(events, "gpu_lost")
    assert lost.attrs["gpu"] == 1
    later = [e for e in events if e.kind == "gpu_summary" and e.time >= START + 15]
    assert {e.attrs["gpu"] for e in later} == {0, 2, 3}


def test_mig_gpus_do_not_break_sampling() -> None:
    sampler, backend, events, _ = make(Scenario.training(gpus=2, mig=(1,)))
    rounds(sampler, backend, range(0, 20, 2))
    assert backend.gpus[1].mig_mode
    assert {e.attrs["gpu"] for e in events if e.kind == "gpu_summary"} == {0, 1}


@pytest.mark.real
def test_collector_exposes_latest_samples_and_passes_promtool(promtool: str) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    sampler, backend, _, _ = make(Scenario.training(gpus=2))
    registry = CollectorRegistry()
    assert sampler.collector is not None
    registry.register(sampler.collector)
    rounds(sampler, backend, range(0, 4, 2))
    text = generate_latest(registry).decode()
    gpu = backend.gpus[0]
    assert (
        f'watchd_gpu_power_watts{{gpu="0",model="{gpu.model}",pci_bus_id="{gpu.pci_bus_id}",'
        f'uuid="{gpu.uuid}"}}' in text
    )
    assert "watchd_gpu_ecc_volatile_uncorrected_errors_total" in text
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_metrics_doc_lists_every_metric() -> None:
    doc = (Path(__file__).parent.parent.parent / "docs" / "gpu-metrics.md").read_text()
    assert dcgm_mapping_markdown() in doc


async def test_no_driver_is_one_log_line_and_source_up_zero() -> None:
    class NoDriver:
        name = "nvml"

        def open(self) -> list[GpuIdentity]:
            raise BackendUnavailable("NVML library not found (libnvidia-ml.so.1): no NVIDIA driver")

        def sample(self, gpu: GpuIdentity, now: float) -> None:  # pragma: no cover
            raise AssertionError

        def wait_xids(self, timeout_s: float) -> list[object]:  # pragma: no cover
            return []

        def close(self) -> None:
            pass

    states: list[bool] = []
    sampler = GpuSampler(NoDriver(), "n", lambda e: None, on_up=states.append)  # type: ignore[arg-type]
    await asyncio.wait_for(sampler.run(), 5)
    assert states == [False]


async def test_nvml_xids_become_events_once_with_the_kernel_log_deduplicated() -> None:
    clock = FakeClock(START)
    backend = FakeGpuBackend(
        Scenario.training(gpus=2, faults=[XidFault(at=0, gpu=0, code=79)]), START, clock=clock
    )
    events: list[Event] = []
    dedup = XidDeduplicator(clock)
    sampler = GpuSampler(backend, "n", events.append, xid_filter=dedup.first, interval_s=0.05, clock=clock)
    task = asyncio.create_task(sampler.run())
    await eventually(lambda: any(e.kind == "xid" for e in events), what="an NVML Xid event")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    (xid,) = [e for e in events if e.kind == "xid"]
    assert (xid.attrs["xid"], xid.source, xid.attrs["bucket"]) == (79, "fake", "RESTART_BM")
    assert not dedup.first(str(xid.attrs["pci_bus_id"]), 79, "kmsg"), "the kernel-log copy is suppressed"
    assert dedup.first(str(xid.attrs["pci_bus_id"]), 79, "fake"), "a repeat from the same source is an event"


async def test_agent_with_a_fake_gpu_ships_health_events_and_serves_gpu_metrics(tmp_path: Path) -> None:
    from tests.agent.test_agent import engine_config, free_port
    from watchd.agent.settings import ShipperConfig
    from watchd.credentials import TokenSource
    from watchd.engine.runner import Engine

    config = AgentConfig(
        node="gpu-node-7",
        engine=EngineEndpoint(url="http://127.0.0.1:1", auth=TokenSource(token="tok")),
        listen=Listen(port=0),
        sources=SourcesConfig(
            kmsg={"enabled": False},  # type: ignore[arg-type]
            gpu=GpuSourceConfig(backend="fake", scenario=SCENARIOS / "healthy_training.yaml", interval_s=0.2),
        ),
        heartbeat=HeartbeatConfig(enabled=False),
        shipper=ShipperConfig(backoff_initial_s=0.05, backoff_max_s=0.2, shutdown_flush_s=1),
    )
    port = free_port()
    config = config.model_copy(
        update={"engine": EngineEndpoint(url=f"http://127.0.0.1:{port}", auth=TokenSource(token="tok"))}
    )
    async with Engine(engine_config(port), use_config_scheduler=False) as engine, Agent(config) as agent:
        await eventually(
            lambda: engine.metrics.events_received.labels("fake", "gpu_summary")._value.get() >= 8,
            what="GPU summaries at the engine",
        )
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{agent.port}/metrics") as r:
            text = await r.text()
    assert 'watchd_source_up{source="fake"} 1.0' in text
    assert text.count("watchd_gpu_power_watts{") == 8


async def test_an_xid_seen_by_the_kernel_log_and_nvml_reaches_the_engine_once(tmp_path: Path) -> None:
    from tests.agent.test_agent import engine_config, free_port
    from watchd.agent.settings import ShipperConfig
    from watchd.credentials import TokenSource
    from watchd.engine.runner import Engine

    scenario = tmp_path / "xid.yaml"
    scenario.write_text(
        "seed: 3\ngpus: {model: H100-SXM, count: 2}\nload: training\n"
        "faults:\n  - {kind: xid, code: 79, at: 0.5, gpu: 1}\n"
    )
    port = free_port()
    config = AgentConfig(
        node="gpu-node-8",
        engine=EngineEndpoint(url=f"http://127.0.0.1:{port}", auth=TokenSource(token="tok")),
        listen=Listen(port=0),
        sources=SourcesConfig(
            kmsg={"enabled": False},  # type: ignore[arg-type]
            gpu=GpuSourceConfig(backend="fake", scenario=scenario, interval_s=0.2),
        ),
        heartbeat=HeartbeatConfig(enabled=False),
        shipper=ShipperConfig(backoff_initial_s=0.05, backoff_max_s=0.2, shutdown_flush_s=1),
    )
    async with Engine(engine_config(port), use_config_scheduler=False) as engine, Agent(config) as agent:
        received = engine.metrics.events_received
        await eventually(
            lambda: (
                received.labels("kmsg", "xid")._value.get() + received.labels("fake", "xid")._value.get() >= 1
            ),
            what="the Xid at the engine",
        )
        await asyncio.sleep(1.5)  # both witnesses have spoken by now
        total = received.labels("kmsg", "xid")._value.get() + received.labels("fake", "xid")._value.get()
        assert total == 1 and agent.dedup.suppressed == 1


async def test_nvml_xids_of_two_mig_instances_are_two_events_with_their_instances() -> None:
    gpu = GpuIdentity(0, "GPU-aaaa", "0000:01:00.0", mig_mode=True)

    class MigBackend:
        name = "nvml"
        rounds = [
            [
                XidNotice(gpu, 94, "Xid 94 reported by NVML", 1, 0),
                XidNotice(gpu, 94, "Xid 94 reported by NVML", 2, 0),
            ]
        ]

        def wait_xids(self, timeout_s: float) -> list[XidNotice]:
            if self.rounds:
                return self.rounds.pop(0)
            raise RuntimeError("stop")  # ends the sampler's Xid loop

    clock = FakeClock(START)
    dedup = XidDeduplicator(clock)
    events: list[Event] = []
    sampler = GpuSampler(MigBackend(), "n", events.append, xid_filter=dedup.first, clock=clock)  # type: ignore[arg-type]
    await sampler._watch_xids()
    assert [(e.attrs["gpu_instance"], e.attrs["compute_instance"]) for e in events] == [(1, 0), (2, 0)]
    assert events[0].id != events[1].id  # the engine drops a repeated id: two instances are two faults
    # the kernel's line of instance 1 is the same fault; instance 3's is another
    assert not dedup.first(gpu.pci_bus_id, 94, "kmsg", 1, 0)
    assert dedup.first(gpu.pci_bus_id, 94, "kmsg", 3, 0)
