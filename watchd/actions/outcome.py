"""What became of an action: one name per outcome, as the audit trail, the metrics and the API show it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    DRAINED = "drained"
    ALREADY_DRAINED = "already_drained"
    REQUEUED = "requeued"
    PARTIAL = "partial"  # some of the jobs requeued, some failed
    NOTHING_TO_REQUEUE = "nothing_to_requeue"
    RESUMED = "resumed"
    NOT_DRAINED = "not_drained"
    REFUSED = "refused"  # drained by someone else: watchd does not resume it
    FIRED = "fired"
    DELIVERED = "delivered"
    REJECTED = "rejected"
    LOGGED = "logged"
    DRY_RUN = "dry_run"
    DEDUPLICATED = "deduplicated"
    SKIPPED = "skipped"
    HELD = "held"
    FAILED = "failed"
    NO_SCHEDULER = "no_scheduler"
    NO_ALERTMANAGER = "no_alertmanager"
    NOT_HELD = "not_held"
    DISCARDED = "discarded"
    CHANGED = "changed"  # a partition's hot spares were set
    RELEASED = "released"  # a hot spare was handed back for the jobs requeued off a drained node
    NO_SPARE = "no_spare"  # none was held in the node's partition
    NO_CHECKS = "no_checks"  # validation asked of an engine without checks
    REBOOTING = "rebooting"  # a reboot was asked for: the node comes back out of service, then is validated
    RESET = "reset"  # the node's agent reset its GPU: the node is still out of service, validated next
    # the node's agent could not reset its GPU (refused, failed, no answer): still out; the rules decide
    NOT_RESET = "not_reset"
    # too many automatic remediations of the node in the window: none more, a person takes over
    LEFT_FOR_A_PERSON = "left_for_a_person"
    # it began changing the cluster and could not finish (leadership lost, the scheduler refused its last
    # step): its intent stays open, and it is driven again by the engine that leads
    INTERRUPTED = "interrupted"
    # a command withdrawn before its agent fetched it: the reason for it no longer held; nothing was run
    WITHDRAWN = "withdrawn"
    CLEARED = "cleared"  # a node's marks were cleared (an operator, or its GPU was replaced)
    NOT_MARKED = "not_marked"  # an unmark of a node that carried no such mark
    # a validation could not check the node's links (no known-good partner was idle): it stays drained, and
    # is validated again when a partner frees up
    NOT_CHECKED = "not_checked"


#: The node is out of service, by watchd.
TOOK_OUT = frozenset({Outcome.DRAINED, Outcome.ALREADY_DRAINED})
#: The node is (or, in dry-run, would be) out of service by watchd: its jobs may be requeued.
DRAINED_BY_US = TOOK_OUT | {Outcome.DRY_RUN}
#: Nothing was done: the key's cooldown is lifted so that the next event tries again.
NOT_DONE = frozenset({Outcome.FAILED, Outcome.NO_SCHEDULER, Outcome.HELD})


@dataclass(frozen=True, slots=True)
class ActionResult:
    outcome: Outcome
    detail: str = ""
    #: what the action left, as JSON data for the audit trail and whoever follows it up (the requeued job
    #: ids, the spare released, a validation's verdicts): never text to parse back
    data: Mapping[str, Any] = field(default_factory=dict)
