"""The ``drains:`` and ``spares:`` sections of the engine config (docs/drains.md): the poll of
every node of the fleet, and the hot spares kept per partition."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from watchd.model.durations import Seconds
from watchd.strict import Strict


class DrainsConfig(Strict):
    """The engine's poll of every node of the fleet (docs/drains.md)."""

    enabled: bool = True
    poll_s: Seconds = 60.0  # how often every node is listed (sinfo -N; the Node objects)
    alert_after_s: Seconds = (
        3 * 86400.0
    )  # a node out longer than this is overdue: node_unavailable overdue=true
    remind_every_s: Seconds = 86400.0  # an overdue node is reported again this often


class SparesConfig(Strict):
    """Hot spares: idle nodes kept out of normal scheduling per partition, released when watchd requeues
    the jobs of a node it drained (docs/drains.md)."""

    partitions: dict[str, Annotated[int, Field(ge=0, le=10_000)]] = Field(default_factory=dict)
    slurm_users: str = Field(default="root", pattern=r"^[A-Za-z0-9_.,-]+$")  # Users= of the reservation
    # a spare released for requeued jobs stays theirs (the partition is not topped up) until they run again
    # or this long: past Slurm's cred_expire (120 s by default), the delay before a requeued job may start
    keep_for_requeued_s: Annotated[float, Field(ge=0, le=86400)] = 600.0
