"""Which nodes out after a failure are back in service, as the fleet listing shows them (pure): every way back
counts (a validation that passed, watchd's resume, an operator's ``scontrol update State=RESUME`` that watchd
never saw), not only those watchd is told of.

A listing is trusted only when it was taken at least :data:`LISTING_MARGIN_S` after the failure was recorded:
one read just before the drain landed (and finished after) shows the node still in service. A node being
validated (the drain lifted inside a maintenance reservation while its checks run) is not back."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from watchd.logs import get_logger
from watchd.model.events import Event, WireError, event_from_wire
from watchd.model.fleet import FleetNode
from watchd.reliability.evidence import FAILURE_OUTCOMES, hardware_evidence
from watchd.store.held import HeldAction

__all__ = ["LISTING_MARGIN_S", "back_in_service", "held_failure"]

_log = get_logger("watchd.reliability")

#: how long after a failure was recorded a listing must be to count (longer than one listing takes)
LISTING_MARGIN_S = 30.0


def back_in_service(
    listing: Sequence[FleetNode],
    listed_at: float,
    out: Mapping[str, float],
    validating: Collection[str] = (),
) -> list[str]:
    """The nodes of ``out`` (node -> when its failure was recorded) that ``listing``, taken at
    ``listed_at``, shows in service."""
    back = []
    for n in listing:
        marked = out.get(n.name)
        if marked is None or n.out_of_service or n.name in validating or n.state in ("unknown", "future"):
            continue
        if listed_at >= marked + LISTING_MARGIN_S:
            back.append(n.name)
    return back


def held_failure(held: HeldAction, outcome: str) -> tuple[Event, str] | None:
    """A released held action that ended ``outcome``: its event and hardware evidence when it is a drain
    that took its node out on hardware evidence (a failure), else None."""
    if held.kind != "drain" or outcome not in FAILURE_OUTCOMES:
        return None
    try:
        source = event_from_wire(held.event, f"held action {held.id}")
    except WireError as exc:
        _log.error("held_event_unreadable", held=held.id, error=str(exc))
        return None
    evidence = hardware_evidence(source)
    return None if evidence is None else (source, evidence)
