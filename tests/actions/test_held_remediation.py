"""A drain the blast-radius breaker held keeps the remediation its rule decided with it: released by an
operator (``watchd actions release``), the drain runs, then its requeue, then the reboot (or GPU reset), each
audited, so that the break-fix loop goes on without a person; one that cannot follow is audited and logged.
The executor over the fake scheduler and the real store (SQLite)."""

from __future__ import annotations

import pytest

from tests.actions.test_executor import decide, make, pool_of, rule_engine
from tests.actions.test_reboot_action import Checks
from tests.support import xid_event
from watchd.actions.executor import Pools
from watchd.actions.safety import BreakerLimits

RULES = """
rules:
  - name: reboot-after-xid
    match: {kind: xid, xid: 79}
    actions:
      - drain: {reason: "Xid {{ xid }}"}
      - requeue
      - reboot: {reason: "reboot after Xid {{ xid }}", max_per_node: 2}
"""


async def test_a_released_drain_reboots_its_node_as_its_rule_decided() -> None:
    fake = pool_of(20)  # 10% of 20 = 2 taken out at most
    fake.add_job("7", ["n2"])
    executor, _, _ = make(
        fake, limits=BreakerLimits(0.10, 50, 3600), pools=Pools.from_members(await fake.pools())
    )
    executor.attach(validation=Checks())
    async with executor:
        await decide(executor, rule_engine(RULES), *(xid_event(f"n{i}", event_id=f"e{i}") for i in range(3)))
        (held,) = executor.store.held.list()
        assert held.node == "n2" and not fake.nodes["n2"].drained
        assert not [c for c in fake.calls if c == ("reboot", "n2")]
        result = await executor.release(held.id, "alice")
        assert result.outcome == "drained", result
        assert "then requeue: requeued" in result.detail and "then reboot: rebooting" in result.detail, result
        assert [c for c in fake.calls if c[0] == "reboot"][-1] == ("reboot", "n2")
        records = [r for r in executor.store.audit.recent(10, node="n2")]
        assert [(r.action, r.outcome) for r in records[-3:][::-1]] in (
            [("drain", "drained"), ("requeue", "requeued"), ("reboot", "rebooting")],
            [("reboot", "rebooting"), ("requeue", "requeued"), ("drain", "drained")],
        ), [(r.action, r.outcome) for r in records]
        reboot = next(r for r in records if r.action == "reboot" and r.event_id == f"held-{held.id}")
        assert reboot.rule == "reboot-after-xid" and reboot.outcome == "rebooting"
        assert reboot.detail.startswith("released by alice, after the drain")


async def test_a_remediation_that_cannot_follow_the_release_is_audited_and_logged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = pool_of(20)
    executor, _, _ = make(
        fake, limits=BreakerLimits(0.10, 50, 3600), pools=Pools.from_members(await fake.pools())
    )
    executor.attach(validation=Checks())
    async with executor:
        await decide(executor, rule_engine(RULES), *(xid_event(f"n{i}", event_id=f"e{i}") for i in range(3)))
        (held,) = executor.store.held.list()
        fake.add_node("n2", flags={"DRAIN"}, reason="admin: PSU swap")  # an admin took it meanwhile
        result = await executor.release(held.id, "alice")
        assert "then reboot: refused drained by someone else: 'admin: PSU swap'" in result.detail, result
        assert "REBOOT_ISSUED" not in fake.nodes["n2"].flags  # an admin's node is never rebooted
        records = executor.store.audit.recent(10, node="n2")
        reboot = next(r for r in records if r.action == "reboot" and r.event_id == f"held-{held.id}")
        assert reboot.outcome == "refused" and reboot.detail.startswith("released by alice, after the drain")
    assert "remediation_not_redriven" in capsys.readouterr().out
