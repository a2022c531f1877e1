"""The action pipeline's config sections: the cooldown and concurrency of actions (``actions:``), the
blast-radius breaker (``safety:``) and the watch over the reboots and GPU resets watchd asked for
(``remediation:``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from watchd.model.durations import Seconds
from watchd.strict import Strict


class ActionsConfig(Strict):
    cooldown_s: Annotated[float, Field(ge=0)] = 600.0
    max_concurrent: Annotated[int, Field(ge=1)] = 1024


class SafetyConfig(Strict):
    max_fraction: Annotated[float, Field(gt=0, le=1)] = 0.10
    max_nodes: Annotated[int, Field(ge=1)] = 50
    window_s: Seconds = 3600.0
    pools_refresh_s: Seconds = 60.0


class RemediationConfig(Strict):
    """How the engine follows a reboot it asked for (the ``reboot`` action): every ``poll_s`` it reads the
    rebooting nodes' states; a node with a new boot and no reboot pending is back (``node_rebooted``: with
    ``checks.auto_validate`` naming it, validation starts); one not back in ``return_timeout_s`` is
    reported once (``node_reboot_overdue``: the shipped rules page)."""

    poll_s: Seconds = 15.0
    return_timeout_s: Seconds = 1800.0
    #: commands waiting for their agents (a GPU reset each) across the fleet; more are not queued
    max_commands: Annotated[int, Field(ge=1)] = 10_000
