"""The agent's ``gpu_reset`` command: the GPU sampling paused (NVML closed), then in a thread the node's own
evidence of a job read (:mod:`watchd.agent.job_evidence`: refused when there is any) and
:func:`watchd.gpu.reset.reset_gpus` run (refused while any process holds the GPU), then the GPUs enumerated
again and the sampling resumed over them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from watchd.agent.commands import Executor
from watchd.agent.job_evidence import MAX_SHOWN, JobEvidence
from watchd.gpu.reset import (
    GpuResetter,
    ResetFailed,
    ResetRefused,
    ResetReport,
    describe_gpus,
    reset_gpus,
)
from watchd.gpu.sampler import GpuSampler
from watchd.model.commands import DONE, FAILED, REFUSED, Command, CommandResult
from watchd.xid.pci import normalize_pci

__all__ = ["gpu_reset_executor"]


def _reset_unless_a_job(resetter: GpuResetter, evidence: JobEvidence | None, target: str) -> ResetReport:
    found = evidence.find(target) if evidence is not None else []
    if found:
        more = f" and {len(found) - MAX_SHOWN} more" if len(found) > MAX_SHOWN else ""
        raise ResetRefused(f"a job is on the node: {'; '.join(found[:MAX_SHOWN])}{more}: not reset")
    return reset_gpus(resetter, target)


def gpu_reset_executor(
    resetter: GpuResetter, sampler: GpuSampler | None, evidence: JobEvidence | None = None
) -> Executor:
    """The executor of ``gpu_reset``: ``evidence`` None reads no evidence of a job but NVML's (tests)."""

    async def execute(command: Command) -> CommandResult:
        text = command.args.get("gpu", "")
        target = normalize_pci(text) if text else ""
        if target is None:
            return CommandResult(
                command.id, REFUSED, f"gpu: {text!r} is not a PCI bus id", finished_at=time.time()
            )
        pause: Any = sampler.paused() if sampler is not None else contextlib.nullcontext()
        async with pause:
            try:
                report = await asyncio.to_thread(_reset_unless_a_job, resetter, evidence, target)
            except ResetRefused as exc:
                return CommandResult(command.id, REFUSED, str(exc), finished_at=time.time())
            except ResetFailed as exc:
                return CommandResult(command.id, FAILED, str(exc), finished_at=time.time())
        detail = (
            f"{', '.join(report.gpus)} reset in {report.seconds:.1f} s ({resetter.name}); "
            f"{len(report.after)} GPUs seen after"
        )
        data = {
            "gpus": list(report.gpus),
            "seconds": report.seconds,
            "after": describe_gpus(report.after),
            "by": resetter.name,
        }
        return CommandResult(command.id, DONE, detail, data, time.time())

    return execute
