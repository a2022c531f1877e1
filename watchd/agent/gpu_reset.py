"""The agent's ``gpu_reset`` command: the GPU sampling paused (NVML closed),
:func:`watchd.gpu.reset.reset_gpus` in a thread (refused while any process holds the GPU), then the GPUs
enumerated again and the sampling resumed over them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from watchd.agent.commands import Executor
from watchd.gpu.reset import GpuResetter, ResetFailed, ResetRefused, describe_gpus, reset_gpus
from watchd.gpu.sampler import GpuSampler
from watchd.model.commands import DONE, FAILED, REFUSED, Command, CommandResult
from watchd.xid.pci import normalize_pci

__all__ = ["gpu_reset_executor"]


def gpu_reset_executor(resetter: GpuResetter, sampler: GpuSampler | None) -> Executor:
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
                report = await asyncio.to_thread(reset_gpus, resetter, target)
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
