"""The reboot action through the executor over the fake scheduler (Slurm 22.05's behaviour): asked once, at
most ``max_per_node`` in the window, refused without checks, over a replaced (lemon) reason, or for a node
someone else drained."""

from __future__ import annotations

from tests.actions.test_executor import make
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.validation import Validation


class Checks:
    async def validate(self, node: str, round_id: str) -> Validation:
        return Validation("resumed", True, "every check passed", ())

    async def recover(self, node: str, round_id: str, reason: str | None) -> Validation:
        return Validation("resumed", True, "", ())


async def test_three_remediations_a_week_then_left_for_a_person() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2"])
    executor, _, clock = make(fake)
    executor.attach(validation=Checks())
    async with executor:
        for n in range(3):
            fake.add_node("gpu-1", flags={"DRAIN"}, reason="watchd: Xid 79")  # drained again
            result = await executor.act(
                "reboot", "gpu-1", {"max_per_node": 3, "window": 7 * 86400}, rule="xid"
            )
            assert result.outcome == "rebooting", result
            assert fake.nodes["gpu-1"].flags >= {"REBOOT_ISSUED"}
            fake.complete_reboot("gpu-1", f"boot-{n}")
            clock.advance(86400)
        fake.add_node("gpu-1", flags={"DRAIN"}, reason="watchd: Xid 79")
        fourth = await executor.act("reboot", "gpu-1", {"max_per_node": 3, "window": 7 * 86400}, rule="xid")
        assert fourth.outcome == "left_for_a_person" and "3 automatic remediations in 7 d" in fourth.detail
        assert [c for c in fake.calls if c[0] == "reboot"] == [("reboot", "gpu-1")] * 3
        clock.advance(5 * 86400)  # the first two are out of the week now: the node's mark still holds
        later = await executor.act("reboot", "gpu-1", {}, rule="xid")
        assert later.outcome == "left_for_a_person" and "marked left for a person" in later.detail
        unmarked = await executor.act("unmark", "gpu-1", {"why": "RMA 42"}, rule="operator")
        assert unmarked.outcome == "cleared"
        assert (await executor.act("reboot", "gpu-1", {}, rule="xid")).outcome == "rebooting"


async def test_refused_without_checks_for_someone_elses_drain_and_in_service() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    fake.add_node("gpu-2", flags={"DRAIN"}, reason="admin: PSU")
    fake.add_node("gpu-3", flags={"DRAIN"}, reason="watchd: Xid 79")
    executor, _, _ = make(fake)
    async with executor:
        assert (await executor.act("reboot", "gpu-3", {}, rule="xid")).outcome == "no_checks"
        executor.attach(validation=Checks())
        assert (await executor.act("reboot", "gpu-2", {}, rule="xid")).outcome == "refused"
        assert (await executor.act("reboot", "gpu-1", {}, rule="xid")).outcome == "not_drained"
    assert not [c for c in fake.calls if c[0] == "reboot" and c[1] == "gpu-3"]


async def test_dry_run_describes_and_touches_nothing() -> None:
    fake = FakeScheduler()
    fake.add_node("gpu-1", flags={"DRAIN"}, reason="watchd: Xid 79")
    executor, _, _ = make(fake, mode="dry-run")
    executor.attach(validation=Checks())
    async with executor:
        result = await executor.act("reboot", "gpu-1", {"reason": "reboot after Xid 79"}, rule="xid")
    assert result.outcome == "dry_run" and "would reboot gpu-1 once idle" in result.detail
    assert not fake.nodes["gpu-1"].reboot_pending
