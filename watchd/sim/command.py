"""``watchd sim``: a fleet of simulated GPU nodes (:mod:`watchd.sim.fleet`), all in one process
(:mod:`watchd.sim.simulator`), shipping to a real engine until the duration ends or it is stopped."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import TextIO

from watchd.errors import UsageError
from watchd.logs import configure_logging
from watchd.sim.fleet import Fleet, load_fleet
from watchd.sim.simulator import Simulator
from watchd.sim.stats import SimStats

__all__ = ["run_sim"]


def run_sim(
    fleet_path: Path,
    url: str,
    token: str | None,
    duration: float | None,
    progress_s: float,
    check: bool,
    log_level: str,
    out: TextIO,
) -> int:
    fleet = load_fleet(fleet_path)
    if duration is not None and duration <= 0:
        raise UsageError("--duration must be positive")
    if progress_s < 0:
        raise UsageError("--progress must be 0 (none) or positive")
    if check:
        jobs = len(fleet.jobs_by_node())
        print(
            f"ok: {fleet.nodes.count} nodes ({fleet.node_names()[0]}..{fleet.node_names()[-1]}) x "
            f"{fleet.gpus.count} {fleet.gpus.model}, {jobs} in jobs, {len(fleet.faults)} faults, "
            f"interval {fleet.interval_s:g} s",
            file=out,
        )
        return 0
    configure_logging(log_level, "auto")
    stats = asyncio.run(_run(fleet, url, token, duration or fleet.duration, progress_s, out))
    print(stats.summary(), file=out, flush=True)
    return 0 if stats.dropped == 0 else 1


async def _run(
    fleet: Fleet, url: str, token: str | None, duration: float | None, progress_s: float, out: TextIO
) -> SimStats:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    deadline = loop.time() + duration if duration is not None else None
    sim = Simulator(fleet, url, token)
    print(
        f"sim: {fleet.nodes.count} nodes x {fleet.gpus.count} GPUs -> {url}, sampling every "
        f"{fleet.interval_s:g} s in {sim.slots} slots, "
        + (f"for {duration:g} s" if duration is not None else "until stopped (Ctrl-C)"),
        file=out,
        flush=True,
    )
    async with sim:
        next_progress = loop.time() + progress_s if progress_s else None
        while not stop.is_set():
            wake = [t for t in (deadline, next_progress) if t is not None]
            timeout = max(0.0, min(wake) - loop.time()) if wake else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout)
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            if next_progress is not None and now >= next_progress:
                print(sim.stats().progress_line(), file=out, flush=True)
                next_progress += progress_s
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    return sim.stats()
