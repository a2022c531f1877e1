"""A node's incidents read from its audit records: from the drain that took it out to its return."""

from __future__ import annotations

from watchd.actions.audit import AuditRecord
from watchd.actions.incidents import incidents


def rec(
    t: float, action: str, outcome: str, node: str = "gpu-1", mode: str = "enforce", rule: str = "xid"
) -> AuditRecord:
    return AuditRecord(t, rule, f"e{t}", node, action, mode, outcome, detail=f"{action} {outcome}")


def test_one_incident_from_drain_to_validated_return() -> None:
    found = incidents(
        [
            rec(1, "alert", "fired"),  # before the drain: not part of an incident
            rec(2, "drain", "drained"),
            rec(3, "requeue", "requeued"),
            rec(4, "reboot", "rebooting"),
            rec(50, "validate", "resumed", rule="validate"),
            rec(60, "drain", "drained", node="gpu-2"),
        ]
    )
    assert [(i.node, i.state, i.opened_at, i.closed_at) for i in found] == [
        ("gpu-1", "returned", 2, 50),
        ("gpu-2", "open", 60, None),
    ]
    assert [s.action for s in found[0].steps] == ["drain", "requeue", "reboot", "validate"]
    assert found[0].remediations == 1
    assert found[0].to_dict()["duration_s"] == 48


def test_a_failed_validation_keeps_it_open_and_a_later_drain_is_a_new_incident() -> None:
    found = incidents(
        [
            rec(2, "drain", "drained"),
            rec(9, "validate", "drained"),  # failed: drained again with the new evidence
            rec(10, "resume", "resumed", rule="operator"),
            rec(20, "drain", "drained"),
            rec(21, "reboot", "left_for_a_person"),
        ]
    )
    assert [(i.state, len(i.steps)) for i in found] == [("returned", 3), ("left_for_a_person", 2)]


def test_dry_run_opens_nothing() -> None:
    assert (
        incidents([rec(1, "drain", "dry_run", mode="dry-run"), rec(2, "drain", "drained", mode="dry-run")])
        == []
    )


def test_a_drain_that_replaced_the_reason_leaves_it_for_a_person() -> None:
    lemon = AuditRecord(
        5, "lemon-node", "e5", "gpu-1", "drain", "enforce", "drained", params={"replace_reason": True}
    )
    [incident] = incidents([rec(2, "drain", "drained"), lemon])
    assert incident.state == "left_for_a_person"
