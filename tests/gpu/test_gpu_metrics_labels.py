"""Per-GPU series are keyed by the GPU alone: a job change starts no new series (``increase()`` over the
lifetime counters holds), the job holding a GPU is ``watchd_gpu_job_info``, and the old ``job`` label comes
back on the gauges only when asked (``sources.gpu.job_label``), never on a counter."""

from __future__ import annotations

import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from watchd.gpu.metrics import JOB_INFO, SPECS, GpuCollector
from watchd.gpu.model import GpuSample
from watchd.sim.gpu import FakeGpuBackend
from watchd.sim.scenario import Scenario

START = 1_800_000_000.0


def samples(n: int = 2) -> list[GpuSample]:
    backend = FakeGpuBackend(Scenario.training(gpus=n), START)
    return [backend.sample(gpu, START + 10) for gpu in backend.open()]


def series(collector: GpuCollector) -> dict[str, list[dict[str, str]]]:
    registry = CollectorRegistry()
    registry.register(collector)
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append(dict(s.labels))
    return out


COUNTERS = [s.name + "_total" for s in SPECS if s.counter]


def test_a_job_change_starts_no_new_series_and_moves_the_info_metric() -> None:
    collector = GpuCollector()
    gpu0, gpu1 = samples()
    collector.update(gpu0, "slurm:41")
    collector.update(gpu1, None)
    before = series(collector)
    collector.update(gpu0, "slurm:42")  # the next job on GPU 0
    collector.update(gpu1, "k8s:8c1e")
    after = series(collector)
    for name in ("watchd_gpu_energy_joules_total", "watchd_gpu_power_watts"):
        assert before[name] == after[name], name  # the same label sets: the same series in Prometheus
    assert "watchd_gpu_energy_joules_total" in COUNTERS
    for name, rows in after.items():
        if name != JOB_INFO:
            assert all(set(r) == {"gpu", "uuid", "pci_bus_id", "model"} for r in rows), name
    assert before[JOB_INFO] == [{"gpu": "0", "uuid": gpu0.gpu.uuid, "job_id": "slurm:41"}]  # idle: none
    assert after[JOB_INFO] == [
        {"gpu": "0", "uuid": gpu0.gpu.uuid, "job_id": "slurm:42"},
        {"gpu": "1", "uuid": gpu1.gpu.uuid, "job_id": "k8s:8c1e"},
    ]


def test_the_job_label_option_labels_the_gauges_and_never_a_counter(promtool: str) -> None:
    collector = GpuCollector(job_label=True)
    gpu0, gpu1 = samples()
    collector.update(gpu0, "slurm:41")
    collector.update(gpu1, None)
    got = series(collector)
    assert got["watchd_gpu_power_watts"][0]["job"] == "slurm:41"
    assert got["watchd_gpu_power_watts"][1]["job"] == ""
    counters = [n for n in COUNTERS if n in got]
    assert len(counters) >= 4
    for name in counters:
        assert all("job" not in r for r in got[name]), name
    registry = CollectorRegistry()
    registry.register(collector)
    res = subprocess.run(
        [promtool, "check", "metrics"],
        input=generate_latest(registry).decode(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("value", ["true", "false"])
def test_the_option_loads_strictly(value: str, tmp_path: object) -> None:
    from pathlib import Path

    from watchd.config import AgentConfig, load_config
    from watchd.errors import ConfigError

    path = Path(str(tmp_path)) / "agent.yaml"
    path.write_text(f"sources: {{gpu: {{backend: none, job_label: {value}}}}}\n")
    assert load_config(AgentConfig, path).sources.gpu.job_label is (value == "true")
    path.write_text("sources: {gpu: {backend: none, job_labels: true}}\n")
    with pytest.raises(ConfigError, match="job_labels"):
        load_config(AgentConfig, path)
