"""The ``slurm:`` section of the engine config: the Slurm commands watchd runs and their timeout."""

from __future__ import annotations

from pathlib import Path

from watchd.integrations.settings import SchedulerSettings
from watchd.model.durations import Seconds


class SlurmConfig(SchedulerSettings):
    enabled: bool = True
    scontrol: str = "scontrol"
    squeue: str = "squeue"
    sinfo: str = "sinfo"
    slurm_conf: Path | None = None
    timeout_s: Seconds = 10.0
