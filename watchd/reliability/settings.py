"""The ``reliability:`` section of the engine config (docs/reliability.md): what is tracked and
kept, the MTBF's confidence, what makes a lemon, and the checkpoint advice's inputs."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from watchd.model.durations import Seconds
from watchd.strict import Strict


class ReliabilityConfig(Strict):
    """Reliability accounting and checkpoint advice (docs/reliability.md)."""

    gap_s: Seconds = 300.0  # a node silent longer than this is not in service meanwhile
    # nodes whose service is tracked in memory; the least recently seen forgotten first (its open interval
    # is closed and saved), like the detectors' fleet state (detectors.max_nodes)
    max_nodes: Annotated[int, Field(ge=1)] = 131_072
    flush_s: Seconds = 60.0  # service intervals are saved this often (a crash loses at most this much)
    interval_s: Seconds = 60.0  # the advice, its findings and the metrics are refreshed this often
    confidence: Annotated[float, Field(gt=0, lt=1)] = 0.9  # of the MTBF interval (two-sided)
    window_days: Annotated[float, Field(gt=0)] = 90.0  # the accounting's default window (--since)
    retention_days: Annotated[float, Field(gt=0)] = 730.0
    lemon_failures: Annotated[int, Field(ge=1)] = 2  # failures within lemon_window_days make a lemon
    lemon_window_days: Annotated[float, Field(gt=0)] = 28.0
    checkpoint_cost_s: Seconds | None = None  # C when a job's heartbeats do not time its checkpoints
    restart_s: Annotated[float, Field(ge=0)] = 0.0  # R in Daly's model: restart time after a failure
    assumed_node_mtbf_hours: Annotated[float, Field(gt=0)] | None = None  # before any exposure is measured
    far_factor: Annotated[float, Field(gt=1)] = 3.0  # interval > factor x advised: a finding
    finding_repeat_s: Seconds = 21600.0  # at most one finding per job this often
    metrics_lemons: Annotated[int, Field(ge=0, le=100)] = 20  # lemons exported by name, at most
    metrics_jobs: Annotated[int, Field(ge=0, le=10000)] = 500  # jobs exported by label, at most
