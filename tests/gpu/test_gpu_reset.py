"""Resetting a GPU on the agent's node: the procedure (refused while a process holds the GPU, every target
enumerated again after), the real resetter (NVML through the cost-faithful stand-in, a stand-in
``nvidia-smi`` that behaves as the real one: exit statuses, the ``-i <UUID>`` argument), the fake (the same
errors, the same seconds), and the sampler paused around it (NVML closed, then the GPUs enumerated again)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import eventually
from watchd.errors import ConfigError
from watchd.gpu.model import GpuIdentity, GpuSample
from watchd.gpu.nvml_standin import StandinNvml
from watchd.gpu.registry import resetter_from_config
from watchd.gpu.reset import NvidiaSmiResetter, ResetFailed, ResetRefused, has_cap_sys_admin, reset_gpus
from watchd.gpu.sampler import GpuSampler
from watchd.gpu.settings import GpuResetConfig
from watchd.sim.gpu import FakeGpuBackend
from watchd.sim.gpu_reset import FakeGpuResetter, for_backend
from watchd.sim.scenario import FallOffBus, Scenario, XidFault

SMI = """#!/bin/sh
echo "$@" >> {calls}
case "$*" in
  *GPU-5ad0c0de-0000-4000-8000-000000000001*) echo "Insufficient Permissions" >&2; exit 4 ;;
  *GPU-5ad0c0de-0000-4000-8000-000000000002*)
    echo "GPU 00000000:38:00.0 was not reset: Unknown Error"; exit 255 ;;
  *GPU-5ad0c0de-0000-4000-8000-000000000003*) sleep 5 ;;
esac
echo "GPU 00000000:18:00.0 was successfully reset."
"""


def smi(tmp_path: Path) -> tuple[Path, Path]:
    calls = tmp_path / "calls"
    script = tmp_path / "nvidia-smi"
    script.write_text(SMI.format(calls=calls))
    script.chmod(0o755)
    return script, calls


def resetter(tmp_path: Path, lib: StandinNvml, **kw: object) -> tuple[NvidiaSmiResetter, Path]:
    script, calls = smi(tmp_path)
    kw.setdefault("capable", lambda: True)
    return NvidiaSmiResetter(str(script), 2.0, lib=lib, proc_root=tmp_path, **kw), calls  # type: ignore[arg-type]


def test_the_real_resetter_refuses_while_a_process_holds_the_gpu(tmp_path: Path) -> None:
    lib = StandinNvml.h200(2)
    lib.gpus[1].pids = (4242,)
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "comm").write_text("python3\n")
    real, calls = resetter(tmp_path, lib)
    with pytest.raises(ResetRefused, match=r"in use: pid 4242 \(python3\) on GPU 0000:28:00.0: not reset"):
        reset_gpus(real, "0000:28:00.0")
    with pytest.raises(ResetRefused, match="in use: pid 4242"):
        reset_gpus(real, "")  # every GPU: one of them is held
    assert not calls.exists(), "nvidia-smi never ran"
    report = reset_gpus(real, "0000:18:00.0")  # the other GPU is free
    assert report.gpus == ("0000:18:00.0",) and len(report.after) == 2
    assert calls.read_text().split("\n")[0] == "--gpu-reset -i GPU-5ad0c0de-0000-4000-8000-000000000000"
    assert lib.calls["nvmlDeviceGetComputeRunningProcesses"] >= 3 and not lib.initialized


def test_the_real_resetter_reports_what_nvidia_smi_says(tmp_path: Path) -> None:
    lib = StandinNvml.h200(4)
    real, calls = resetter(tmp_path, lib)
    with pytest.raises(ResetRefused, match=r"exit status 4 \(insufficient permissions\): Insufficient Perm"):
        reset_gpus(real, "0000:28:00.0")
    with pytest.raises(
        ResetFailed, match=r"exit status 255: GPU 00000000:38:00.0 was not reset: Unknown Error"
    ):
        reset_gpus(real, "0000:38:00.0")
    with pytest.raises(ResetFailed, match="did not finish in 2 s"):
        reset_gpus(real, "0000:48:00.0")
    with pytest.raises(ResetRefused, match=r"no GPU 0000:99:00.0 on this node \(it has: 0000:18:00.0, "):
        reset_gpus(real, "0000:99:00.0")
    assert reset_gpus(real, "").gpus == ("0000:18:00.0", "0000:28:00.0", "0000:38:00.0", "0000:48:00.0")
    assert calls.read_text().splitlines()[-1] == "--gpu-reset"  # every GPU at once: no -i
    missing = NvidiaSmiResetter(str(tmp_path / "nope"), lib=lib, capable=lambda: True)
    with pytest.raises(ResetRefused, match="not found"):
        reset_gpus(missing, "0000:18:00.0")
    lacking = NvidiaSmiResetter(str(tmp_path / "nvidia-smi"), lib=lib, capable=lambda: False)
    with pytest.raises(ResetRefused, match="lacks CAP_SYS_ADMIN"):
        reset_gpus(lacking, "0000:18:00.0")


def test_a_gpu_that_does_not_come_back_is_a_failed_reset(tmp_path: Path) -> None:
    lib = StandinNvml.h200(2)
    real, _ = resetter(tmp_path, lib)
    lost_after = NvidiaSmiResetter(
        real.nvidia_smi, lib=lib, capable=lambda: True, run=lambda *a, **k: _lose(lib, *a, **k)
    )
    with pytest.raises(ResetFailed, match=r"GPU 0000:18:00.0 not seen after the reset \(1 GPUs are\)"):
        reset_gpus(lost_after, "0000:18:00.0")
    # a GPU off the bus is not enumerated: not one a reset brings back (a reboot's matter)
    with pytest.raises(ResetRefused, match=r"no GPU 0000:18:00.0 on this node \(it has: 0000:28:00.0\)"):
        reset_gpus(lost_after, "0000:18:00.0")


def _lose(lib: StandinNvml, *args: object, **kw: object) -> subprocess.CompletedProcess[str]:
    lib.gpus[0].lost = True  # the reset left it off the bus
    return subprocess.CompletedProcess([], 0, "", "")


def test_the_capability_is_read_from_proc(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t000001ffffffffff\n")
    assert has_cap_sys_admin(status) is True
    status.write_text("CapEff:\t0000000000000004\n")  # CAP_DAC_READ_SEARCH only
    assert has_cap_sys_admin(status) is False
    assert has_cap_sys_admin(tmp_path / "none") is None


def test_the_fake_has_the_same_errors_and_the_same_cost() -> None:
    backend = FakeGpuBackend(Scenario.idle(gpus=2), time.time())
    fake = for_backend(backend, delay_s=0.3)
    started = time.monotonic()
    report = reset_gpus(fake, backend.gpus[1].pci_bus_id)
    assert time.monotonic() - started >= 0.3, "a reset takes time"
    assert report.gpus == (backend.gpus[1].pci_bus_id,) and fake.resets == [report.gpus]
    training = FakeGpuBackend(Scenario.training(gpus=2), time.time())
    with pytest.raises(
        ResetRefused,
        match=r"in use: pid \d+ \(python3\) on GPU 0000:18:00.0, pid \d+ \(python3\) on GPU 0000:2a",
    ):
        reset_gpus(for_backend(training, 0.0), "")
    # a process that takes the GPU between the check and the reset: nvidia-smi's own refusal
    late = FakeGpuResetter(
        lambda: backend.gpus, holders=lambda g: (7,) if calls.append(g) or len(calls) > 1 else ()
    )
    calls: list[GpuIdentity] = []
    with pytest.raises(
        ResetFailed, match="exit status 255: The following GPUs could not be reset: GPU 00000000:18"
    ):
        reset_gpus(late, backend.gpus[0].pci_bus_id)


def test_a_reset_clears_the_faults_of_its_gpu_but_not_a_gpu_off_the_bus() -> None:
    start = time.time() - 100
    faults = [XidFault(at=10, gpu=0, code=95), FallOffBus(at=10, gpu=1)]
    backend = FakeGpuBackend(Scenario.idle(gpus=2, faults=faults), start)
    fake = for_backend(backend, 0.0)
    assert backend._faults_of(0)  # the Xid's fault is on
    reset_gpus(fake, backend.gpus[0].pci_bus_id)
    assert backend._faults_of(0) == []
    with pytest.raises(
        ResetFailed, match=r"exit status 15: Unable to reset GPU 00000000:2A:00.0: GPU is lost"
    ):
        reset_gpus(fake, backend.gpus[1].pci_bus_id)


async def test_the_sampler_is_paused_around_a_reset_and_enumerates_again() -> None:
    backend = FakeGpuBackend(Scenario.idle(gpus=2), time.time())
    opened: list[str] = []
    real_open, real_close = backend.open, backend.close

    def open_() -> list[GpuIdentity]:
        opened.append("open")
        return real_open()

    def close() -> None:
        opened.append("close")
        real_close()

    backend.open, backend.close = open_, close  # type: ignore[method-assign]
    samples: list[GpuSample] = []
    sampler = GpuSampler(backend, "gpu-1", lambda e: None, interval_s=0.01)
    sampler.observe = samples.extend  # type: ignore[method-assign]
    task = asyncio.ensure_future(sampler.run())
    await eventually(lambda: bool(samples), 10, "a first round of samples")
    async with sampler.paused():
        during = len(samples)
        await asyncio.sleep(0.1)
        assert len(samples) == during, "no sample while paused"
        assert opened == ["open", "close"]
    assert opened == ["open", "close", "open"] and len(sampler.gpus) == 2
    await asyncio.sleep(0.05)
    assert len(samples) > during, "sampling again"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert opened[-1] == "close"


def test_the_resetter_follows_the_gpu_backend_and_imports_the_simulation_only_for_it() -> None:
    backend = FakeGpuBackend(Scenario.idle(gpus=1), time.time())
    assert isinstance(resetter_from_config(GpuResetConfig(), backend), FakeGpuResetter)
    assert isinstance(resetter_from_config(GpuResetConfig(), None), NvidiaSmiResetter)
    with pytest.raises(ConfigError, match=r"needs sources\.gpu\.backend fake"):
        resetter_from_config(GpuResetConfig(backend="fake"), None)
    code = (
        "import sys; from watchd.gpu.registry import resetter_from_config; "
        "from watchd.gpu.settings import GpuResetConfig; resetter_from_config(GpuResetConfig(), None); "
        "print(any(m.startswith('watchd.sim') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
