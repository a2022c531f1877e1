"""Which events are hardware evidence: a watchd drain decided on one of them is a *failure* of the node.

A failure (docs/reliability.md) is a drain by watchd (outcome ``drained``, or ``dry_run`` in dry-run: the
fault happened either way) whose triggering event carries hardware evidence by the classes of
:mod:`watchd.model.conditions`:

- an ``xid`` whose resolution bucket is a hardware bucket (:data:`HARDWARE_XID_BUCKETS`; an event without a
  bucket is looked up in the catalog by its number);
- a ``gpu_health`` condition of the hardware class (:data:`HARDWARE_CONDITIONS`) while it holds (value != 0);
- a finding (``nccl_hang``, ``straggler``, ``host_stall``) with ``hardware: true`` (a culprit backed by such
  evidence).

Not failures: application Xids, drains on findings without hardware attribution, the lemon rule's drain
(it follows a failure already counted), drains by admins or other tools, a drain deduplicated within the
cooldown (the same fault reported again).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from watchd.model.conditions import HARDWARE_CONDITIONS, HARDWARE_XID_BUCKETS
from watchd.model.events import Event
from watchd.model.finding import KINDS as FINDING_KINDS
from watchd.model.gpu import HEALTH_KIND
from watchd.model.xid import KIND as XID_KIND
from watchd.xid.catalog import lookup

__all__ = ["EVIDENCE", "FAILURE_OUTCOMES", "HARDWARE_KINDS", "hardware_evidence"]

#: drain outcomes that count as a failure (in enforce, and in dry-run)
FAILURE_OUTCOMES = frozenset({"drained", "dry_run"})


def _xid(event: Event) -> str | None:
    xid = event.attrs.get("xid")
    if not isinstance(xid, int) or isinstance(xid, bool):
        return None
    bucket = event.attrs.get("bucket")
    if not isinstance(bucket, str):
        bucket = lookup(xid).bucket
    return f"xid {xid} ({bucket})" if bucket in HARDWARE_XID_BUCKETS else None


def _health(event: Event) -> str | None:
    condition = event.attrs.get("condition")
    value = event.attrs.get("value")
    if condition in HARDWARE_CONDITIONS and value not in (0, 0.0, None, False):
        return f"gpu_health {condition}"
    return None


def _finding(event: Event) -> str | None:
    if event.attrs.get("hardware") is True:
        return f"{event.kind} ({event.attrs.get('evidence') or 'hardware'})"
    return None


#: kind -> what reads the hardware evidence an event of it carries; the kinds that can carry some
EVIDENCE: Mapping[str, Callable[[Event], str | None]] = MappingProxyType(
    {XID_KIND: _xid, HEALTH_KIND: _health, **dict.fromkeys(FINDING_KINDS, _finding)}
)
HARDWARE_KINDS = frozenset(EVIDENCE)


def hardware_evidence(event: Event) -> str | None:
    """One line naming the hardware evidence ``event`` carries, or None when it carries none."""
    read = EVIDENCE.get(event.kind)
    return None if read is None else read(event)


def gpu_of(event: Event) -> int | None:
    """The GPU index the evidence names, when it does."""
    for name in ("gpu", "culprit_gpu"):
        value = event.attrs.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
