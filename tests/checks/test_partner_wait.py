"""A validation whose pair check finds no idle known-good partner (none before the first pair round, none
free on a busy cluster): the node is *not checked* (never failed), stays drained saying so in the 20
characters ``sinfo -R`` shows, is paged about once after ``checks.partner_wait`` (10 minutes by default), and
is validated again, through the fleet listing the engine keeps (no scheduler call of its own), as soon as a
partner is idle: then it returns to service. Fake runner, fake clock (the real cluster:
tests/checks/test_pair_checks_slurm.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tests.checks.test_pairs import TWO_NODES, pair_config
from tests.checks.test_service import Harness, nodes
from watchd.checks.params import ChecksConfig
from watchd.checks.runner import Availability, RunOutput
from watchd.checks.subsystem import Checks
from watchd.integrations.fake.checks import FakeCheckRunner
from watchd.model.fleet import FleetNode
from watchd.store.database import Store


def test_the_shipped_wait_is_ten_minutes() -> None:
    assert ChecksConfig().partner_wait == 600.0


def listing(runner: FakeCheckRunner) -> list[FleetNode]:
    """The fleet listing as the engine's poll would read it from the same nodes."""
    return [
        FleetNode(n.name, "slurm", n.partitions, n.state, frozenset(n.flags), n.reason)
        for n in runner.nodes.values()
    ]


def wired(h: Harness, runner: FakeCheckRunner) -> tuple[Checks, list[str]]:
    asked: list[str] = []

    async def validate(node: str, note: str, mode: Any) -> dict[str, Any]:
        asked.append(note)
        v = await h.service.validate(node, f"validate:{len(asked)}")
        return {"outcome": v.done, "detail": v.detail}

    checks = Checks(h.service, validate, frozenset())
    checks.fleet_nodes = lambda: listing(runner)
    return checks, asked


async def test_no_partner_pages_after_the_wait_and_completes_once_one_frees_up() -> None:
    runner = FakeCheckRunner(nodes(3), lambda job: RunOutput("completed", TWO_NODES, 0))
    h = Harness(pair_config(), runner)
    await h.service.run_round("fabric")  # n000..n002 pass: the known-good nodes
    for n in ("n001", "n002"):
        runner.nodes[n].state = "allocated"  # a busy cluster: every known-good node runs a job
    runner.nodes["n000"].flags.add("DRAIN")
    runner.nodes["n000"].reason = "watchd: Xid79 3b:00 GPU has fallen off the bus"
    checks, asked = wired(h, runner)
    h.events.clear()

    v = await h.service.validate("n000", "validate:auto")
    assert (v.done, v.passed) == ("not_checked", False)
    reason = runner.nodes["n000"].reason or ""
    assert reason[:20] == "watchd: fabric not c", reason  # what sinfo -R shows: not checked, not failed
    assert "no node that passed fabric is idle to pair with" in reason
    assert [e.attrs["outcome"] for e in h.events] == ["not_checked"]
    assert "DRAIN" in runner.nodes["n000"].flags
    assert h.service.status()["waiting_for_partner"] == {
        "n000": {"check": "fabric", "since": h.clock.now(), "paged": False}
    }

    h.clock.advance(599)
    assert await checks.partners_tick() == []  # no partner idle: nothing tried, nobody paged yet
    assert [e.attrs["outcome"] for e in h.events] == ["not_checked"]

    h.clock.advance(1)  # checks.partner_wait: paged, once
    await checks.partners_tick()
    await checks.partners_tick()
    pages = [e for e in h.events if e.attrs.get("overdue")]
    assert len(pages) == 1, h.events
    assert pages[0].node == "n000" and pages[0].attrs["outcome"] == "not_checked"
    assert pages[0].attrs["waited_s"] == 600.0 and pages[0].attrs["check"] == "fabric"

    runner.nodes["n002"].state = "idle"  # a partner frees up: validated again, and back in service
    assert await checks.partners_tick() == ["n000"]
    for task in list(checks._background):
        await task
    assert asked == ["auto: n002 is idle to pair with"]
    assert "DRAIN" not in runner.nodes["n000"].flags
    assert runner.submitted[-1].nodes == ("n000", "n002")
    assert h.service.waiting == {}


async def test_the_wait_survives_a_restart() -> None:
    runner = FakeCheckRunner(nodes(2), lambda job: RunOutput("completed", TWO_NODES, 0))
    store = Store.open(":memory:")
    h = Harness(pair_config(), runner, store)
    runner.nodes["n000"].flags.add("DRAIN")
    runner.nodes["n000"].reason = "watchd: Xid79"
    h.clock.advance(1000)
    assert (await h.service.validate("n000", "validate:1")).done == "not_checked"
    since = h.service.waiting["n000"].since
    h.clock.advance(300)
    assert (await h.service.validate("n000", "validate:2")).done == "not_checked"
    assert h.service.waiting["n000"].since == since  # one wait, however many tries

    again = Harness(pair_config(), runner, store)
    again.clock.advance(h.clock.now() - again.clock.now())
    await again.service.start()
    try:
        assert list(again.service.waiting) == ["n000"] and again.service.waiting["n000"].since == since
    finally:
        await again.service.stop()


async def test_a_partner_slurm_takes_before_the_run_is_replaced_and_the_fabric_is_not_blamed() -> None:
    taken: list[str] = []

    def script(job: Any) -> RunOutput:
        if job.validation and not taken:  # Slurm gave the first partner to a waiting job: never started
            taken.append(job.peers[0])
            return RunOutput("not_started", "", None, f"did not start: {job.peers[0]} taken by job 77")
        return RunOutput("completed", TWO_NODES, 0)

    runner = FakeCheckRunner(nodes(3), lambda job: RunOutput("completed", TWO_NODES, 0))
    h = Harness(pair_config(), runner)
    await h.service.run_round("fabric")
    runner.script = script
    runner.nodes["n000"].flags.add("DRAIN")
    runner.nodes["n000"].reason = "watchd: Xid79"
    v = await h.service.validate("n000", "validate:1")
    tried = [j.nodes for j in runner.submitted if j.validation]
    assert (v.done, v.passed) == ("resumed", True), v
    (first,) = taken
    assert len(tried) == 2 and tried[0] == ("n000", first) and tried[1][1] not in ("n000", first), tried
    history = [
        (r["outcome"], r["evidence"]) for r in h.service.history("n000", 10) if "validate" in r["round"]
    ]
    assert [o for o, _ in history] == ["passed", "skipped"], history
    assert history[1][1].startswith(f"{first} was taken before the check started: did not start: {first}")


async def test_the_last_check_before_the_lend_passes_over_a_partner_just_taken() -> None:
    runner = FakeCheckRunner(nodes(3), lambda job: RunOutput("completed", TWO_NODES, 0))
    h = Harness(pair_config(), runner)
    await h.service.run_round("fabric")
    runner.nodes["n000"].flags.add("DRAIN")
    runner.nodes["n000"].reason = "watchd: Xid79"
    real = runner.availability
    grabbed: list[str] = []

    async def availability(names: Sequence[str], within_s: float) -> dict[str, Availability]:
        out = await real(names, within_s)
        if not grabbed and len(names) > 1:  # right after the partners are chosen, a job lands on the first
            grabbed.append(names[0])
            runner.nodes[names[0]].state = "allocated"
        return out

    runner.availability = availability  # type: ignore[method-assign]
    v = await h.service.validate("n000", "validate:1")
    assert (v.done, v.passed) == ("resumed", True), v
    lent = [j.nodes for j in runner.submitted if j.validation]
    assert len(lent) == 1 and grabbed[0] not in lent[0], (grabbed, lent)


async def test_a_partner_gone_by_the_retry_is_tried_again_only_a_minute_later() -> None:
    runner = FakeCheckRunner(nodes(2), lambda job: RunOutput("completed", TWO_NODES, 0))
    h = Harness(pair_config(), runner)
    await h.service.run_round("fabric")
    runner.nodes["n000"].flags.add("DRAIN")
    runner.nodes["n000"].reason = "watchd: Xid79"
    runner.nodes["n001"].state = "allocated"
    checks, asked = wired(h, runner)
    assert (await h.service.validate("n000", "validate:0")).done == "not_checked"
    runner.nodes["n001"].state = "idle"
    stale = listing(runner)  # the listing shows n001 idle; by the retry, a job has it
    checks.fleet_nodes = lambda: stale
    runner.nodes["n001"].state = "allocated"

    async def tick() -> list[str]:
        again = await checks.partners_tick()
        for task in list(checks._background):
            await task
        return again

    assert await tick() == ["n000"]
    assert h.service.waiting["n000"].check == "fabric"  # still not checked, still waiting
    begins = len([j for j in runner.submitted if j.validation])
    assert await tick() == []  # not every tick: each try lifts the drain and runs the node checks
    h.clock.advance(59)
    assert await tick() == []
    h.clock.advance(1)
    assert await tick() == ["n000"]
    assert len(asked) == 2 and len([j for j in runner.submitted if j.validation]) == begins


async def test_a_follower_neither_pages_nor_validates_again() -> None:
    runner = FakeCheckRunner(nodes(2), lambda job: RunOutput("completed", TWO_NODES, 0))
    h = Harness(pair_config(), runner)
    await h.service.run_round("fabric")
    runner.nodes["n000"].flags.add("DRAIN")
    runner.nodes["n000"].reason = "watchd: Xid79"
    runner.nodes["n001"].state = "allocated"
    checks, asked = wired(h, runner)
    assert (await h.service.validate("n000", "validate:0")).done == "not_checked"
    runner.nodes["n001"].state = "idle"
    h.clock.advance(3600)
    h.events.clear()
    checks.leading = lambda: False
    assert await checks.partners_tick() == [] and h.events == [] and asked == []
    checks.leading = lambda: True
    assert await checks.partners_tick() == ["n000"]
    for task in list(checks._background):
        await task
    assert h.events[0].attrs.get("overdue") is True and asked
