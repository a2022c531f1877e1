"""The ``jobs:`` section of the engine config: how often the job topology is refreshed, and how long an
agent's report of a GPU's job counts."""

from __future__ import annotations

from watchd.model.durations import Seconds
from watchd.strict import Strict


class JobsConfig(Strict):
    """Job topology: which nodes and GPUs each job runs on (from the scheduler and from the agents)."""

    refresh_s: Seconds = (
        30.0  # the scheduler's running jobs (squeue --states=RUNNING) are read this often ...
    )
    min_refresh_s: Seconds = 5.0  # ... and sooner, at most this often, when agents report an unknown job
    member_ttl_s: Seconds = 60.0  # an agent's report of a GPU's job counts this long
