"""The ``fake:`` section of the engine config: the nodes and partitions of the in-memory scheduler."""

from __future__ import annotations

from pydantic import Field

from watchd.integrations.settings import SchedulerSettings


class FakeSchedulerConfig(SchedulerSettings):
    """The in-memory scheduler (demos, trying rules against named nodes): it drains and resumes in memory
    only, with Slurm's semantics, and touches nothing."""

    nodes: list[str] = Field(default_factory=list)
    partitions: dict[str, list[str]] = Field(default_factory=dict)  # empty: one pool "all" of every node
