"""The ``reports:`` section of the engine config (docs/reports.md): what is observed and kept, and
the usage metrics read from Slurm accounting."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from watchd.model.durations import Seconds, parse_duration
from watchd.strict import Strict


class ReportsConfig(Strict):
    """Per-team usage, waits, energy and lost GPU-hours (docs/reports.md)."""

    observe: bool = True  # record energy and idle time per job GPU and the jobs' checkpoints in the state
    metrics: bool = False  # publish watchd_usage_* (reads Slurm accounting every metrics_interval_s)
    source: Literal["slurm", "none"] = "slurm"  # none: no slurmdbd, only what watchd observed
    window: Annotated[float, BeforeValidator(parse_duration)] = 7 * 86400.0  # the metrics' window
    metrics_interval_s: Annotated[float, Field(ge=10)] = 300.0
    idle_util_pct: Annotated[float, Field(ge=0, le=100)] = 5.0  # a GPU window under this is idle
    max_accounts: Annotated[int, Field(ge=1, le=10_000)] = 50  # accounts with own series; the rest: (other)
    per_user: bool = False  # also a user label on the metrics (bounded by max_accounts accounts)
    timeout_s: Seconds = 300.0  # for each of sacct, sshare, squeue
    retention_days: Annotated[float, Field(gt=0)] = 90.0  # observations kept in the state database
