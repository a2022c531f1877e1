"""Safety state held, not replayed: the remediations of a node and its marks (a lemon, left for a person) live
in the node's record in the state database, read and written in one transaction with the claim of each
remediation. No amount of other audit records hides them, a resume does not clear them, a re-drive is not
counted twice, two engines racing for the last slot cannot both win, and a mark is cleared only by the
audited ``unmark`` (an operator's, or the engine's when the marked GPU was replaced)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.actions.test_executor import make
from tests.actions.test_gpu_reset_action import Agent, drained
from tests.actions.test_reboot_action import Checks
from tests.support import eventually
from watchd.actions.agent_commands import AgentCommands
from watchd.actions.audit import AuditRecord
from watchd.actions.marks import NodeMarks
from watchd.actions.outcome import ActionResult
from watchd.clock import FakeClock
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.commands import Command, CommandResult
from watchd.model.events import Event
from watchd.store.database import Store
from watchd.store.node_records import Claimed, Refused

LEMON = {"reason": "lemon, RMA suspected: implicated twice in 28 days", "replace_reason": True}


def flood(store: Store, node: str, rows: int, at: float) -> None:
    """What a flapping GPU writes by itself: every repeated Xid on the drained node is an alert and three
    ``deduplicated`` records."""
    for i in range(rows):
        store.audit.append(
            AuditRecord(
                at + i * 1e-3, "xid-fatal-hardware", f"e{i}", node, "drain", "enforce", "deduplicated"
            )
        )


async def test_a_flood_of_other_records_does_not_hide_a_lemon() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, _, clock = make(fake)
    executor.attach(validation=Checks())
    async with executor:
        assert (await executor.act("drain", "gpu-1", LEMON, rule="lemon-node")).outcome == "drained"
        flood(executor.store, "gpu-1", 1200, clock.now() + 1)  # 300 repeated Xid lines, 4 records each
        clock.advance(3600)
        result = await executor.act("reboot", "gpu-1", {}, rule="xid-fatal-hardware")
        assert result.outcome == "left_for_a_person", result
        assert "marked a lemon by rule lemon-node" in result.detail
        resumed = await executor.operator_resume("gpu-1", "alice")
        assert resumed.outcome == "refused" and "watchd node unmark gpu-1" in resumed.detail
    assert not [c for c in fake.calls if c[0] in ("reboot", "resume")]


async def test_a_flood_does_not_reset_a_node_left_for_a_person() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, _, clock = make(fake)
    queue = AgentCommands(clock)
    executor.attach(validation=Checks(), commands=queue)
    agent = Agent(queue)
    params = {"max_per_node": 1}
    async with executor:
        assert (await executor.act("gpu_reset", "gpu-1", params, rule="xid")).outcome == "reset"
        clock.advance(60)
        assert (await executor.act("gpu_reset", "gpu-1", params, rule="xid")).outcome == "left_for_a_person"
        flood(executor.store, "gpu-1", 1200, clock.now() + 1)
        clock.advance(3600)
        again = await executor.act("gpu_reset", "gpu-1", params, rule="xid")
        assert again.outcome == "left_for_a_person" and "marked left for a person" in again.detail
    agent.stop()
    assert len(agent.ran) == 1


async def test_a_resume_outside_watchd_does_not_clear_a_mark_an_unmark_does_and_is_audited() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, audit, clock = make(fake)
    executor.attach(validation=Checks())
    async with executor:
        await executor.act("drain", "gpu-1", LEMON, rule="lemon-node")
        fake.add_node("gpu-1")  # scontrol update State=RESUME by hand
        drained(fake)  # and drained again by a later Xid
        clock.advance(60)
        assert (await executor.act("reboot", "gpu-1", {}, rule="xid")).outcome == "left_for_a_person"
        cleared = await executor.act("unmark", "gpu-1", {"why": "RMA 1234: GPU replaced"}, rule="operator")
        assert cleared.outcome == "cleared" and "RMA 1234" in cleared.detail
        assert (
            await executor.act("unmark", "gpu-1", {"why": "again"}, rule="operator")
        ).outcome == "not_marked"
        assert (await executor.act("reboot", "gpu-1", {}, rule="xid")).outcome == "rebooting"
        history = executor.store.nodes.history("gpu-1")
    assert [(m.mark, m.cleared_why) for m in history] == [("lemon", "RMA 1234: GPU replaced")]
    assert [(a.action, a.outcome) for a in audit.entries if a.action == "unmark"] == [
        ("unmark", "cleared"),
        ("unmark", "not_marked"),
    ]


async def test_a_remediation_that_touched_nothing_is_not_counted() -> None:
    fake = FakeScheduler()
    drained(fake)
    executor, _, clock = make(fake)
    queue = AgentCommands(clock)
    executor.attach(validation=Checks(), commands=queue)

    def refuse(command: Command) -> CommandResult:
        return CommandResult(command.id, "refused", "a process holds the GPU", finished_at=1.0)

    agent = Agent(queue, answer=refuse)
    async with executor:
        for _ in range(3):
            clock.advance(60)
            assert (
                await executor.act("gpu_reset", "gpu-1", {"max_per_node": 1}, rule="xid")
            ).outcome == "not_reset"
    agent.stop()
    assert executor.store.nodes.remediations("gpu-1", 0.0) == 0
    assert executor.store.nodes.open_marks("gpu-1") == []


def test_a_claim_made_again_is_not_counted_twice_and_two_engines_cannot_both_take_the_last_slot(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "state.db")
    one, two = Store.open(path), Store.open(path)
    try:
        first = one.nodes.claim(
            "gpu-1", "gpu_reset", "gpu_reset:gpu-1#1", "xid", 100.0, window_s=3600, limit=2
        )
        assert first == Claimed(1)
        again = two.nodes.claim(
            "gpu-1", "gpu_reset", "gpu_reset:gpu-1#1", "xid", 101.0, window_s=3600, limit=2
        )
        assert again == Claimed(1, again=True)
        answers = [
            store.nodes.claim("gpu-1", "reboot", f"reboot:gpu-1#{i}", "xid", 102.0, window_s=3600, limit=2)
            for i, store in enumerate((one, two), start=2)
        ]
        assert [type(a) for a in answers] == [Claimed, Refused]
        refused = answers[1]
        assert isinstance(refused, Refused) and refused.limit_reached and refused.count == 2
        assert [m.mark for m in one.nodes.open_marks("gpu-1")] == ["left_for_a_person"]
        # the window passing does not lift the mark: a person does
        later = one.nodes.claim("gpu-1", "reboot", "reboot:gpu-1#9", "xid", 1e6, window_s=3600, limit=2)
        assert isinstance(later, Refused) and not later.limit_reached
    finally:
        one.close()
        two.close()


async def test_a_lemon_mark_set_while_a_reset_waits_for_the_jobs_stops_it() -> None:
    fake = FakeScheduler()
    drained(fake, state="allocated")  # its job is still ending
    executor, _, clock = make(fake)
    queue = AgentCommands(clock)
    executor.attach(validation=Checks(), commands=queue)
    agent = Agent(queue)
    async with executor:
        reset = asyncio.ensure_future(executor.act("gpu_reset", "gpu-1", {}, rule="xid"))
        await asyncio.sleep(0.05)  # the reset waits for the node to be idle
        assert (await executor.act("drain", "gpu-1", LEMON, rule="lemon-node")).outcome == "drained"
        drained(fake)  # the job ended
        result = await asyncio.wait_for(reset, 10)
    agent.stop()
    assert result.outcome == "left_for_a_person" and "lemon" in result.detail, result
    assert agent.ran == []
    assert executor.store.nodes.remediations("gpu-1", 0.0) == 0


def _summary(node: str, slot: str, uuid: str, at: float) -> Event:
    return Event(
        kind="gpu_summary",
        node=node,
        source="nvml",
        time=at,
        id=f"{node}-{slot}-{uuid}-{at}",
        attrs={"gpu": 0, "uuid": uuid, "pci_bus_id": slot},
    )


async def test_a_replaced_gpu_in_the_marked_slot_clears_the_mark() -> None:
    store = Store.open(":memory:")
    store.nodes.mark("gpu-1", "lemon", "lemon-node", "lemon, RMA suspected", 10.0, "0000:3b:00.0", "GPU-old")
    store.nodes.mark("gpu-2", "lemon", "lemon-node", "lemon, RMA suspected", 10.0)  # no slot known
    asked: list[tuple[str, dict[str, object], str]] = []

    async def unmark(node: str, params: dict[str, object], who: str, event_id: str) -> ActionResult:
        asked.append((node, params, who))
        store.nodes.clear(node, who, str(params["why"]), 20.0)
        return ActionResult("cleared")  # type: ignore[arg-type]

    marks = NodeMarks(store.nodes, unmark, FakeClock(), lambda: True)
    await marks.start()
    marks.observe(_summary("gpu-1", "0000:3b:00.0", "GPU-old", 11.0))  # the same GPU: nothing
    marks.observe(_summary("gpu-1", "0000:5d:00.0", "GPU-other", 11.0))  # another slot: remembered
    marks.observe(_summary("gpu-2", "0000:3b:00.0", "GPU-a", 11.0))  # first sight: remembered
    await asyncio.sleep(0)
    assert asked == []
    assert store.nodes.open_marks("gpu-2")[0].gpus == {"0000:3b:00.0": "GPU-a"}
    marks.observe(_summary("gpu-1", "0000:5d:00.0", "GPU-swapped", 12.0))  # not the marked slot
    await asyncio.sleep(0)
    assert asked == []
    marks.observe(_summary("gpu-1", "0000:3b:00.0", "GPU-new", 12.0))
    marks.observe(_summary("gpu-2", "0000:3b:00.0", "GPU-b", 12.0))
    await eventually(lambda: len(asked) == 2)
    assert asked[0][0] == "gpu-1" and "0000:3b:00.0 was replaced (GPU-old -> GPU-new)" in str(
        asked[0][1]["why"]
    )
    assert asked[1][0] == "gpu-2" and asked[1][2] == "watchd"
    assert store.nodes.marked() == []
    await marks.stop()
