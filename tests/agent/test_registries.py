"""The agent's registries: log sources and GPU backends built from the config by name, each imported only
where configured, and a clear config error for a name nobody registered."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from watchd.errors import ConfigError
from watchd.gpu.dcgm_backend import DcgmBackend
from watchd.gpu.nvml import NvmlBackend
from watchd.gpu.registry import GPU_BACKENDS, backend_from_config
from watchd.gpu.settings import GpuSourceConfig
from watchd.sources.base import FakeLogSource
from watchd.sources.filefollow import FileFollowSource
from watchd.sources.kmsg import KmsgSource
from watchd.sources.registry import SOURCES, SourceContext, sources_from_config
from watchd.sources.settings import FileSourceConfig, KmsgConfig, SourcesConfig

SCENARIO = Path(__file__).parent.parent / "gpu_scenarios" / "healthy_training.yaml"


# --------------------------------------------------------------------------- log sources


def test_the_source_registry_has_kmsg_files_and_the_fake_kernel_log() -> None:
    assert sorted(SOURCES) == ["fake", "files", "journald", "journald-units", "kmsg", "pods", "slurm-jobs"]


def test_default_sources_are_kmsg_alone() -> None:
    lost: list[int] = []
    [kmsg] = sources_from_config(SourcesConfig(), SourceContext(on_kmsg_lost=lost.append))
    assert isinstance(kmsg, KmsgSource)
    assert (kmsg.path, kmsg.state_file) == (Path("/dev/kmsg"), Path("/var/lib/watchd/kmsg.state"))
    kmsg._on_lost(3)
    assert lost == [3]


def test_each_file_is_followed_and_kmsg_can_be_turned_off(tmp_path: Path) -> None:
    config = SourcesConfig(
        kmsg=KmsgConfig(enabled=False),
        files=[FileSourceConfig(path=tmp_path / "a.log"), FileSourceConfig(path=tmp_path / "b.log")],
    )
    sources = sources_from_config(config, SourceContext())
    assert all(isinstance(s, FileFollowSource) for s in sources)
    assert [s.name for s in sources] == [f"file:{tmp_path / 'a.log'}", f"file:{tmp_path / 'b.log'}"]


def test_a_fake_gpu_brings_its_kernel_log_as_a_source() -> None:
    context = SourceContext()
    config = SourcesConfig(
        kmsg=KmsgConfig(enabled=False), gpu=GpuSourceConfig(backend="fake", scenario=SCENARIO)
    )
    assert sources_from_config(config, context) == [context.fake_kernel_log]
    assert sources_from_config(SourcesConfig(kmsg=KmsgConfig(enabled=False)), context) == []


def test_only_the_named_sources_are_built() -> None:
    config = SourcesConfig(gpu=GpuSourceConfig(backend="fake", scenario=SCENARIO))
    [fake] = sources_from_config(config, SourceContext(), names=["fake"])
    assert isinstance(fake, FakeLogSource)


def test_an_unknown_source_name_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^sources: no source named 'syslog' \(known: fake, files, journald, journald-units, kmsg, "
        r"pods, slurm-jobs\)",
    ):
        sources_from_config(SourcesConfig(), SourceContext(), names=["kmsg", "syslog"])


# --------------------------------------------------------------------------- GPU backends


def test_the_gpu_backend_registry_has_nvml_dcgm_and_fake() -> None:
    assert sorted(GPU_BACKENDS) == ["dcgm", "fake", "nvml"]


def test_backends_are_built_by_name() -> None:
    assert backend_from_config(GpuSourceConfig(backend="none"), print) is None
    assert isinstance(backend_from_config(GpuSourceConfig(), print), NvmlBackend)
    dcgm = backend_from_config(GpuSourceConfig(backend="dcgm", dcgm_url="http://h:9400/metrics"), print)
    assert isinstance(dcgm, DcgmBackend)
    assert (dcgm.url, dcgm.max_age_s) == ("http://h:9400/metrics", 1.0)  # half the sampling interval


def test_the_fake_backend_writes_its_driver_lines_to_the_kernel_log_it_is_given() -> None:
    lines: list[str] = []
    scenario = SCENARIO.parent / "ecc_dbe.yaml"  # GPU 3: Xid 48 at 120 s
    backend = backend_from_config(GpuSourceConfig(backend="fake", scenario=scenario), lines.append)
    assert backend is not None and backend.name == "fake"
    gpus = backend.open()
    backend.sample(gpus[3], time.time() + 130.0)
    assert any("Xid" in line and ": 48," in line for line in lines)


def test_an_unknown_backend_is_a_config_error_naming_the_key() -> None:
    config = GpuSourceConfig.model_construct(backend="rocm")  # past the schema, as a new name would be
    with pytest.raises(
        ConfigError,
        match=r"^sources\.gpu\.backend: unknown GPU backend 'rocm' \(known: dcgm, fake, nvml, none\)",
    ):
        backend_from_config(config, print)


def test_the_agent_imports_no_gpu_library_nor_simulation_code_unless_configured() -> None:
    code = (
        "import sys\n"
        "from watchd.agent.runner import Agent\n"
        "from watchd.config import AgentConfig\n"
        "from watchd.gpu.settings import GpuSourceConfig\n"
        "from watchd.gpu.registry import backend_from_config\n"
        "backend_from_config(GpuSourceConfig(backend='dcgm'), print)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('watchd.sim', 'watchd.gpu.nvml', 'pynvml'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
