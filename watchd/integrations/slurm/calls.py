"""How often watchd asks Slurm: every Slurm command watchd runs (a process, or a line of the long-lived
interactive scontrol: each is a request to slurmctld) is counted here, by command (``scontrol``, ``squeue``,
``sinfo``, ``sbatch``, ``scancel``, ``sacct``, ``sshare``).

The count is the process's own (one engine, or one CLI run); :class:`SlurmCallsCollector` exposes it as
``watchd_slurm_calls_total{command}`` on the registry it is added to, read at scrape time, so the adapters
need no registry of their own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["SlurmCallsCollector", "count_call", "counts"]

_lock = threading.Lock()
_counts: dict[str, int] = {}


def count_call(program: str) -> None:
    """One request to Slurm through ``program`` (a command name or path: counted by its base name)."""
    command = os.path.basename(program) or program
    with _lock:
        _counts[command] = _counts.get(command, 0) + 1


def counts() -> dict[str, int]:
    """The calls so far, by command."""
    with _lock:
        return dict(_counts)


class SlurmCallsCollector(Collector):
    """``watchd_slurm_calls_total{command}``: the Slurm commands this process has run."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "watchd_slurm_calls",
            "Slurm commands run (processes and interactive scontrol lines: each one request to slurmctld), "
            "by command",
            labels=["command"],
        )
        for command, n in sorted(counts().items()):
            family.add_metric([command], float(n))
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        return self.collect()
