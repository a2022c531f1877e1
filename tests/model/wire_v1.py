"""The batches of tests/data/wire-v1, built again by today's code along the paths they were recorded through
(the agent's kernel-log builder, the GPU sampler's NVML Xid, health and summary events, the heartbeat
coalescer, the detectors' findings, the executor's action feedback), with the same inputs: the replay test
compares the bytes. The inputs are those of the one-shot recorder that wrote the files."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any

from tests.ib.wire import ib_events
from tests.trainlog.wire import trainlog_events
from watchd.agent.heartbeat import Coalescer, parse_report
from watchd.agent.runner import xid_event
from watchd.clock import FakeClock
from watchd.detect.finding import Finding
from watchd.gpu.backend import XidNotice
from watchd.gpu.model import GpuIdentity, GpuSample
from watchd.gpu.sampler import GpuSampler
from watchd.model.action import ActionFeedback
from watchd.model.events import Event, batch_to_wire, fit_to_wire, stable_id
from watchd.model.jobs import JobRef
from watchd.sources.base import LogLine
from watchd.xid import XidParser

NODE = "gpu-07"
T0 = 1_764_800_000.0

KMSG_LINES = [
    "[  102.345678] NVRM: GPU at PCI:0000:9b:00: GPU-8f6b2e4a-1c3d-4e5f-a6b7-c8d9e0f1a2b3",
    "[  102.345700] NVRM: Xid (PCI:0000:9b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the "
    "bus.",
    "Dec  4 10:00:01 gpu-07 kernel: NVRM: Xid (PCI:0009:3b:00): 13, pid=4242, name=nvc:[driver], Graphics SM "
    "Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    "NVRM: Xid (0000:01:00): 8, Channel 00000010",
    "NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=python3, Ch 00000008, intr 10000000. MMU Fault: ENGINE "
    "GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_3c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    "NVRM: Xid (PCI:0000:18:00): 48, pid=999, name=python, An uncorrectable double bit error (DBE) has been "
    "detected on GPU in the framebuffer at partition 6, subpartition 0.",
    "NVRM: Xid (PCI:0018:2a:00): 154, pid='<unknown>', name=<unknown>, GPU recovery action changed from 0x0 "
    "(None) to 0x1 (Reset Required)",
    "NVRM: Xid (PCI:0000:5d:00): 145, pid='<unknown>', name=<unknown>, NETIR_LINK_EVT  Fatal   XC0 i0 Link "
    "01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
    "NVRM: Xid (PCI:0000:5d:00): 149, pid='<unknown>', name=<unknown>, RLW_REMAP  Nonfatal XC0 i0 Link 03 "
    "(0x00000001 0x00000000)",
    "NVRM: Xid (PCI:0000:ab:00): 45, pid=77, name=torchrun, Ch 00000010",
    "NVRM: Xid (PCI:0000:ab:00): 999, pid=78, name=weird, something new",
    "NVRM: GPU 0000:ba:00.0: GPU has fallen off the bus.",
    "NVRM: The NVIDIA GPU 0000:db:00.0",
    "NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
    "NVRM: Xid (PCI:0000:2a:00): 94, pid=31337, name=pt_main_thread, Contained: SM (0x1). RST: No, D-RST: No",
    "NVRM: Xid (PCI:0000:2a:00): 119, pid='<unknown>', name=<unknown>, Timeout after 6s of waiting for RPC "
    "response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x2080014b 0x5).",
    "NVRM: Xid (PCI:0000:3a:00): 13, pid=5, name=long, " + "x" * 9000,
]
FILE_LINE = (
    "NVRM: Xid (PCI:0000:9a:00): 64, pid=1, name=init, ECC page retirement or row remapper recording failure"
)

GPUS = [
    GpuIdentity(
        i, f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd", f"0000:{bus:02x}:00.0", "NVIDIA H200", f"SN{i}"
    )
    for i, bus in enumerate((0x18, 0x2A, 0x3A, 0x5D))
]
K8S_POD = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def _body(events: Iterable[Event]) -> bytes:
    """As the shipper sends them: every event through fit_to_wire, compact JSON."""
    fitted = [fit_to_wire(e) for e in events]
    return json.dumps(batch_to_wire(NODE, fitted), separators=(",", ":")).encode()


class _StubBackend:
    name = "nvml"

    def __init__(self) -> None:
        self.xids: list[list[XidNotice]] = [
            [
                XidNotice(GPUS[0], 79, "GPU has fallen off the bus"),
                XidNotice(GPUS[1], 48, "Xid 48 reported by NVML"),
            ],
            [XidNotice(GPUS[3], 154, "")],
        ]

    def open(self) -> list[GpuIdentity]:
        return list(GPUS)

    def sample(self, gpu: GpuIdentity, now: float) -> GpuSample:
        raise AssertionError("not sampled")

    def wait_xids(self, timeout_s: float) -> list[XidNotice]:
        if self.xids:
            return self.xids.pop(0)
        raise RuntimeError("stop")  # ends the sampler's Xid loop

    def close(self) -> None:
        pass


class _Jobs:
    def jobs_for(self, pids: Iterable[int]) -> JobRef | None:
        pids = tuple(pids)
        if 100 in pids:
            return JobRef("slurm", "4242")
        return JobRef("k8s", K8S_POD) if pids else None


_BASE: dict[str, Any] = dict(
    util_gpu=97.0,
    util_mem=40.0,
    mem_used_bytes=80 << 30,
    mem_total_bytes=141 << 30,
    temp_c=61.0,
    power_w=650.5,
    power_limit_w=700.0,
    energy_j=1.2e6,
    sm_clock_mhz=1980.0,
    sm_clock_max_mhz=1980.0,
    clock_event_reasons=0,
    ecc_volatile_corrected=0,
    ecc_volatile_uncorrected=0,
    ecc_aggregate_corrected=3,
    ecc_aggregate_uncorrected=0,
    remapped_rows_correctable=0,
    remapped_rows_uncorrectable=0,
    remap_pending=False,
    remap_failure=False,
    retired_pages_pending=False,
    pcie_replay_count=0,
    pcie_link_gen=5,
    pcie_link_gen_max=5,
    pcie_link_width=16,
    pcie_link_width_max=16,
    pcie_tx_bytes_per_s=1.5e9,
    pcie_rx_bytes_per_s=2.25e9,
    nvlink_up=(True,) * 18,
    nvlink_errors=0,
    nvlink_tx_bytes_per_s=1.0e11,
    nvlink_rx_bytes_per_s=1.1e11,
    recovery_action=0,
    pids=(100,),
)


def _sample(t: float, gpu: GpuIdentity, **changes: Any) -> GpuSample:
    return GpuSample(time=t, gpu=gpu, **{**_BASE, **changes})


def _round(k: int, now: float) -> list[GpuSample]:
    """Round ``k`` of 40 (every 2 s): faults start at round 10 and change later."""
    bad = k >= 10
    g0, g1, g2, g3 = GPUS
    lost = 12 <= k < 20
    return [
        _sample(
            now,
            g0,
            ecc_volatile_uncorrected=2 if bad else 0,
            remap_pending=bad,
            remap_failure=k >= 20,
            remapped_rows_uncorrectable=3 if k >= 20 else 0,
            retired_pages_pending=25 <= k < 35,
            power_w=650.5 + k,
        ),
        _sample(
            now,
            g1,
            pcie_link_width=8 if bad else 16,
            pcie_link_gen=3 if k >= 30 else 5,
            pcie_replay_count=k * 20 if bad else 0,
            clock_event_reasons=0x8 | 0x40 if bad and k < 30 else 0x1,
            pids=(200, 201),
        ),
        _sample(
            now,
            g2,
            nvlink_up=tuple(i != 3 for i in range(18)) if bad else (True,) * 18,
            nvlink_errors=k * 5 if bad else 0,
            clock_event_reasons=0x80 | 0x20 if bad else 0,
            recovery_action=(1 if k < 25 else 5) if bad else 0,
            util_gpu=None,
            temp_c=None,
            pids=(),
        ),
        GpuSample(time=now, gpu=g3, lost=True)
        if lost
        else _sample(
            now,
            g3,
            nvlink_up=None,
            nvlink_tx_bytes_per_s=None,
            nvlink_rx_bytes_per_s=None,
            recovery_action=None,
            pids=(100,),
            sm_clock_mhz=1400.0 + k,
        ),
    ]


def _kmsg_events() -> list[Event]:
    events: list[Event] = []
    parser = XidParser()
    for i, text in enumerate(KMSG_LINES):
        line = LogLine(text=text, time=T0 + i * 0.25, key=f"kmsg:{1000 + i}", seq=1000 + i)
        for index, record in enumerate(parser.feed(text)):
            events.append(xid_event(NODE, "kmsg", line, record, index))
    line = LogLine(text=FILE_LINE, time=T0 + 9, key="file:/var/log/kern.log:4711")
    for index, record in enumerate(XidParser().feed(FILE_LINE)):
        events.append(xid_event(NODE, "file:/var/log/kern.log", line, record, index))
    return events


def _heartbeats() -> list[Event]:
    clock = FakeClock(T0 + 200)
    coalescer = Coalescer(NODE, clock, forward_interval_s=2.0)
    reports: list[dict[str, Any]] = [
        {"job": "slurm:4242", "rank": 0, "step": 1, "time": T0 + 200, "phase": "init"},
        {
            "job": "slurm:4242",
            "rank": 0,
            "step": 2,
            "time": T0 + 201,
            "step_time_s": 1.25,
            "compute_time_s": 0.9,
            "collective_seq": 17,
            "local_rank": 0,
            "gpu": 0,
        },
        {"job": "4243", "rank": 7, "step": 10, "step_time_s": 2.0},
        {"job": f"k8s:{K8S_POD}", "rank": 1, "step": 0, "phase": "checkpoint", "gpu": 1},
        {
            "job": "slurm:4242",
            "rank": 0,
            "step": 3,
            "time": T0 + 203.5,
            "step_time_s": 1.5,
            "compute_time_s": 1.0,
            "collective_seq": 18,
            "local_rank": 0,
            "gpu": 0,
            "phase": "done",
        },
    ]
    out: list[Event] = []
    for report in reports:
        out.extend(coalescer.offer(parse_report(report, clock.now())) or [])
        clock.advance(2.5)
        out.extend(coalescer.due())
    return out


FINDINGS = [
    Finding(
        kind="nccl_hang",
        job="slurm:4242",
        time=T0 + 300,
        onset=T0 + 262.4567,
        summary="job slurm:4242 hangs in a collective: gpu-07 GPU 3 lost (xid 79 (RESTART_BM))",
        confidence=0.95,
        evidence="xid 79 (RESTART_BM)",
        hardware=True,
        culprit_node=NODE,
        culprit_gpu=3,
        suspects=(NODE, "gpu-08"),
        partition="gpu",
        signal="nvml+heartbeat",
        revision=1,
        extra={"gpus": 16, "gpus_matching": 15, "detail": "15 of 16 GPUs spinning at 19% of their power"},
    ),
    Finding(
        kind="nccl_hang",
        job=f"k8s:{K8S_POD}",
        time=T0 + 310,
        onset=T0 + 270,
        summary="no culprit",
        confidence=0.5,
        suspects=("gpu-08", "gpu-09"),
        signal="heartbeat",
        extra={"gpus": 8, "gpus_matching": 8, "detail": "all ranks silent"},
    ),
    Finding(
        kind="host_stall",
        job="slurm:4243",
        time=T0 + 320,
        onset=T0 + 250.12,
        summary="every GPU idle",
        confidence=0.7,
        suspects=(NODE,),
        partition="debug",
        extra={"gpus": 4, "gpus_matching": 4, "detail": "util 0%"},
    ),
    Finding(
        kind="straggler",
        job="slurm:4242",
        time=T0 + 900,
        onset=T0 + 500,
        summary="job slurm:4242: gpu-07 GPU 1 sm_clock -25% vs the job's median (hardware: HwSlowdown)",
        confidence=0.9,
        evidence="HwSlowdown",
        hardware=True,
        culprit_node=NODE,
        culprit_gpu=1,
        suspects=(NODE,),
        partition="gpu",
        signal="nvml",
        revision=2,
        extra={"metric": "sm_clock", "value": 1485.0, "job_median": 1980.0, "deviation": -0.25},
    ),
    Finding(
        kind="straggler",
        job="slurm:4242",
        time=T0 + 950,
        onset=T0 + 600,
        summary="rank 5 slow (software imbalance)",
        confidence=0.6,
        evidence="none",
        hardware=False,
        culprit_node="gpu-09",
        culprit_gpu=None,
        suspects=("gpu-09",),
        signal="heartbeat",
        extra={"metric": "compute_time", "value": 1.6, "job_median": 1.2, "deviation": 0.3333, "rank": 5},
    ),
]


def _actions() -> list[Event]:
    done = [
        ("drain", "drained", "enforce"),
        ("requeue", "requeued", "enforce"),
        ("alert", "dry_run", "dry-run"),
    ]
    return [
        ActionFeedback(action=kind, outcome=outcome, rule="xid-fatal-hardware", mode=mode).to_event(
            id=stable_id("action", "ev1", "xid-fatal-hardware", kind, NODE),
            node=NODE,
            source="watchd",
            time=T0 + 400 + i,
        )
        for i, (kind, outcome, mode) in enumerate(done)
    ]


def build() -> dict[str, bytes]:
    """File name (without .json) -> the batch body today's code builds."""
    out = {"kmsg-xid": _body(_kmsg_events())}
    emitted: list[Event] = []
    sampler = GpuSampler(
        _StubBackend(),
        NODE,
        emitted.append,
        clock=FakeClock(T0 + 20),
        jobs=_Jobs(),  # type: ignore[arg-type]
        summary_window_s=5.0,
        health_report_interval_s=30.0,
    )
    asyncio.run(sampler._watch_xids())
    out["nvml-xid"] = _body(emitted)
    emitted.clear()
    for k in range(40):
        sampler.observe(_round(k, T0 + 100.0 + 2 * k))
    emitted.extend(sampler.summaries.flush(NODE))
    out["nvml-gpu-health"] = _body(e for e in emitted if e.kind == "gpu_health")
    out["nvml-gpu-summary"] = _body(e for e in emitted if e.kind == "gpu_summary")
    out["heartbeat"] = _body(_heartbeats())
    out["findings"] = _body(f.to_event() for f in FINDINGS)
    out["watchd-action"] = _body(_actions())
    out["trainlog"] = _body(trainlog_events(NODE, T0 + 500))  # issue 19
    out["ib-sysfs"] = _body(ib_events(NODE, T0 + 600))  # InfiniBand/RoCE ports, recorded when added
    return out
