"""Each stage of the action pipeline alone, with a fake ``next`` (and the leadership gate with a fake
Leadership, through the whole executor)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from tests.support import xid_event
from watchd.actions.alerting import AlertKeeper
from watchd.actions.audit import MemoryAudit
from watchd.actions.executor import ActionExecutor, Pools
from watchd.actions.gates import Safety
from watchd.actions.handler import Attempt, Mode
from watchd.actions.handlers import HANDLERS, handler_for
from watchd.actions.held import Hold
from watchd.actions.leader_gate import LeaderGate
from watchd.actions.outcome import ActionResult, Outcome
from watchd.actions.runtime import Runtime
from watchd.actions.safety import BreakerLimits
from watchd.actions.stages import Pipeline
from watchd.actions.stages.dedup import Deduplicate
from watchd.actions.stages.execute import Execute
from watchd.actions.stages.follow import FollowTheDrain
from watchd.actions.stages.leadership import Leadership
from watchd.actions.stages.mode import DryRun
from watchd.actions.stages.record import Record
from watchd.actions.stages.safety import SafetyLimits
from watchd.actions.trail import AuditTrail
from watchd.clock import FakeClock
from watchd.engine.metrics import EngineMetrics
from watchd.integrations.alerts import FakeAlertSink
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.events import Event
from watchd.rules import DISRUPTIVE, Decision, PlannedAction
from watchd.rules.model import ACTION_NAMES, RateLimit
from watchd.store.database import Store

DONE = ActionResult(Outcome.DRAINED, "done")


class Next:
    """A fake rest of the pipeline: answers ``result`` and remembers what it was given."""

    def __init__(self, result: ActionResult = DONE) -> None:
        self.result = result
        self.seen: list[Attempt] = []

    async def __call__(self, attempt: Attempt) -> ActionResult:
        self.seen.append(attempt)
        return self.result


class FakeLeadership:
    def __init__(self, leads: bool, holder: str | None = "engine-b", takeover_wait_s: float = 0.5) -> None:
        self.leads = leads
        self.holder = holder
        self.takeover_wait_s = takeover_wait_s
        self.waits: list[float] = []

    async def wait_leader(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return self.leads

    async def confirm(self) -> bool:
        return self.leads


def decision(*actions: PlannedAction, rate_limit: RateLimit | None = None) -> Decision:
    return Decision(
        rule="r",
        severity="critical",
        event=xid_event("gpu-1"),
        actions=actions,
        labels={},
        group={"node": "gpu-1"},
        rate_limit=rate_limit,
    )


def attempt(
    kind: str, node: str = "gpu-1", params: Mapping[str, Any] | None = None, mode: Mode = "enforce", **kw: Any
) -> Attempt:
    action = PlannedAction(kind, node, dict(params or {}))
    kw.setdefault("decision", decision(action))
    return Attempt(action, handler_for(kind), mode, "r", "e1", 100.0, dict(params or {}), **kw)


# ---------------------------------------------------------------------------------------------- the table


def test_the_rule_model_derives_from_the_handler_table() -> None:
    assert tuple(k for k, h in HANDLERS.items() if h.rule_action) == ACTION_NAMES
    # what only the engine or an operator starts is an action like the others, not a rule's to name
    assert {"spare", "spare_release", "validate"} <= set(HANDLERS) - set(ACTION_NAMES)
    assert {"drain", "requeue", "resume", "alert", "webhook", "log"} <= set(HANDLERS)
    assert {k for k, h in HANDLERS.items() if h.disruptive} == DISRUPTIVE
    assert {"drain", "requeue"} <= DISRUPTIVE and not {"resume", "alert", "webhook", "log"} & DISRUPTIVE
    with pytest.raises(ValueError, match="unknown action 'reimage'"):
        handler_for("reimage")


# ---------------------------------------------------------------------------------------------- pipeline


async def test_pipeline_runs_stages_in_order_and_a_stage_may_answer_alone() -> None:
    order: list[str] = []

    class Mark:
        def __init__(self, name: str, answer: bool = False) -> None:
            self.name, self.answer = name, answer

        async def __call__(self, a: Attempt, next: Any) -> ActionResult:
            order.append(self.name)
            return ActionResult(Outcome.LOGGED, self.name) if self.answer else await next(a)

    result = await Pipeline(Mark("a"), Mark("b", answer=True), Mark("c")).run(attempt("log"))
    assert order == ["a", "b"] and result == ActionResult(Outcome.LOGGED, "b")


# ---------------------------------------------------------------------------------------------- follow


@pytest.mark.parametrize(
    ("drain", "expected"),
    [
        (Outcome.DEDUPLICATED, Outcome.DEDUPLICATED),
        (Outcome.SKIPPED, Outcome.SKIPPED),
        (Outcome.FAILED, Outcome.SKIPPED),
        (Outcome.HELD, Outcome.SKIPPED),
    ],
)
async def test_a_requeue_after_a_drain_that_did_not_take_the_node_out_does_nothing(
    drain: Outcome, expected: Outcome
) -> None:
    rest = Next()
    result = await FollowTheDrain()(attempt("requeue", after_drain=drain), rest)
    assert result.outcome == expected and rest.seen == []


@pytest.mark.parametrize("drain", [Outcome.DRAINED, Outcome.ALREADY_DRAINED, Outcome.DRY_RUN])
async def test_a_requeue_after_watchds_drain_runs_counted_not_checked(drain: Outcome) -> None:
    rest = Next()
    await FollowTheDrain()(attempt("requeue", after_drain=drain), rest)
    assert [a.check_safety for a in rest.seen] == [False]


async def test_follow_leaves_everything_else_alone() -> None:
    rest = Next()
    await FollowTheDrain()(attempt("requeue"), rest)  # no drain before it
    await FollowTheDrain()(attempt("alert", after_drain=Outcome.SKIPPED), rest)
    assert [a.check_safety for a in rest.seen] == [True, True]


# ---------------------------------------------------------------------------------------------- dedup


async def test_dedup_writes_the_intent_and_answers_repeats_within_the_cooldown() -> None:
    store, clock = Store.open(":memory:"), FakeClock()
    stage = Deduplicate(store, clock, 600.0, None)
    rest = Next()
    assert (await stage(attempt("drain"), rest)).outcome == Outcome.DRAINED
    (intent,) = store.intents.under("drain:gpu-1")
    assert intent.outcome == "drained" and intent.finished
    again = await stage(attempt("drain"), rest)
    assert again.outcome == Outcome.DEDUPLICATED and len(rest.seen) == 1
    assert again.detail == "drain of gpu-1 already decided within the cooldown"


async def test_dedup_lifts_the_cooldown_when_nothing_was_done() -> None:
    store, clock = Store.open(":memory:"), FakeClock()
    stage = Deduplicate(store, clock, 600.0, None)
    rest = Next(ActionResult(Outcome.FAILED, "scontrol: exit 1"))
    await stage(attempt("requeue"), rest)
    await stage(attempt("requeue"), rest)  # the next event retries
    assert len(rest.seen) == 2


async def test_dedup_keys_come_from_the_handler() -> None:
    store, clock = Store.open(":memory:"), FakeClock()
    stage = Deduplicate(store, clock, 600.0, None)
    await stage(attempt("requeue", params={"job": "42"}), Next())
    await stage(attempt("drain", params={"replace_reason": True}), Next())
    assert [i.key for i in store.intents.unfinished()] == []
    assert store.intents.under("requeue:gpu-1:42") and store.intents.under("drain-reason:gpu-1")
    rest = Next()
    for _ in range(2):  # not de-duplicated: every decision alerts
        await stage(attempt("alert"), rest)
    assert len(rest.seen) == 2


# ---------------------------------------------------------------------------------------------- mode


def safety(store: Store, max_nodes: int = 10_000, sizes: int = 100) -> Safety:
    pools = Pools.from_members({"gpu": [f"gpu-{i}" for i in range(sizes)]})
    return Safety(store, BreakerLimits(max_fraction=1.0, max_nodes=max_nodes), pools)


async def test_dry_run_describes_instead_of_acting() -> None:
    store = Store.open(":memory:")
    rest = Next()
    result = await DryRun(safety(store))(attempt("drain", params={"reason": "Xid 79"}, mode="dry-run"), rest)
    assert result == ActionResult(Outcome.DRY_RUN, "would drain gpu-1: watchd: Xid 79") and rest.seen == []
    assert store.breaker.since("dry-run:gpu", 0) == [("gpu-1", 100.0)]  # counted apart
    assert store.breaker.since("gpu", 0) == []


async def test_dry_run_says_when_the_safety_limits_would_hold() -> None:
    store = Store.open(":memory:")
    store.breaker.record("dry-run:gpu", "gpu-9", 99.0)
    result = await DryRun(safety(store, max_nodes=1))(attempt("drain", mode="dry-run"), Next())
    assert (
        result.outcome == Outcome.DRY_RUN and "the safety limits would hold it: blast-radius" in result.detail
    )


async def test_dry_run_still_alerts_and_enforce_passes_through() -> None:
    rest = Next()
    stage = DryRun(safety(Store.open(":memory:")))
    await stage(attempt("alert", mode="dry-run"), rest)
    await stage(attempt("drain", mode="enforce"), rest)
    assert [a.action.kind for a in rest.seen] == ["alert", "drain"]


# ---------------------------------------------------------------------------------------------- leadership


async def test_a_follower_does_nothing_and_says_who_leads() -> None:
    lead = FakeLeadership(leads=False, holder="engine-b", takeover_wait_s=2.5)
    rest = Next()
    for kind in ("drain", "alert", "webhook"):
        result = await Leadership(LeaderGate(lead))(attempt(kind), rest)
        assert result == ActionResult(
            Outcome.FAILED, f"{kind} of gpu-1: not the leader (the lease is held by engine-b); nothing done"
        )
    assert rest.seen == [] and lead.waits == [2.5, 2.5, 2.5]


async def test_leadership_names_nobody_and_lets_a_log_through() -> None:
    rest = Next()
    stage = Leadership(LeaderGate(FakeLeadership(leads=False, holder=None)))
    result = await stage(attempt("resume"), rest)
    assert result.detail == "resume of gpu-1: not the leader (the lease is held by nobody); nothing done"
    await stage(attempt("log"), rest)  # no side effect
    await Leadership(LeaderGate(FakeLeadership(leads=True)))(attempt("drain"), rest)
    await Leadership(LeaderGate())(attempt("drain"), rest)  # None: a lone engine always leads
    assert [a.action.kind for a in rest.seen] == ["log", "drain", "drain"]


# ---------------------------------------------------------------------------------------------- safety


async def test_safety_holds_beyond_the_rule_rate_limit_and_pages() -> None:
    store, sink = Store.open(":memory:"), FakeAlertSink()
    spawned: list[asyncio.Task[None]] = []
    keeper = AlertKeeper(
        sink,
        store,
        FakeClock(),
        LeaderGate(),
        lambda c: spawned.append(asyncio.ensure_future(c)),
        lambda: 60.0,
    )
    stage = SafetyLimits(
        safety(store), Hold(store, keeper, lambda c: spawned.append(asyncio.ensure_future(c)))
    )
    limit = RateLimit(max=1, per=60.0)
    rest = Next(ActionResult(Outcome.REQUEUED, "requeued 1"))

    def requeue(node: str) -> Attempt:
        action = PlannedAction("requeue", node, {})
        return attempt("requeue", node, decision=decision(action, rate_limit=limit), requeue_follows=False)

    assert (await stage(requeue("gpu-1"), rest)).outcome == Outcome.REQUEUED
    held = await stage(requeue("gpu-2"), rest)
    assert held.outcome == Outcome.HELD and held.detail.startswith("held as #1: rate limit of rule r")
    assert len(rest.seen) == 1 and [h.node for h in store.held.list()] == ["gpu-2"]
    again = await stage(requeue("gpu-2"), rest)  # a repeated event holds no second row
    assert again.detail.startswith("already held as #1")
    await asyncio.gather(*spawned)
    assert sink.names() == ["WatchdBlastRadiusBreakerOpen"]
    keeper.close()


async def test_safety_hands_a_drain_its_gate_and_holds_what_the_round_held() -> None:
    store = Store.open(":memory:")
    keeper = AlertKeeper(None, store, FakeClock(), LeaderGate(), lambda c: c.close(), lambda: 60.0)
    stage = SafetyLimits(safety(store), Hold(store, keeper, lambda c: c.close()))
    rest = Next(ActionResult(Outcome.HELD, "blast-radius breaker: full"))
    result = await stage(attempt("drain", requeue_follows=True), rest)
    (seen,) = rest.seen
    assert seen.gate is not None and seen.gate.verdict is None  # asked by the drain round, not before
    assert result.outcome == Outcome.HELD
    (held,) = store.held.list()
    assert held.params == {"requeue_after_release": True}


async def test_safety_passes_what_is_not_disruptive() -> None:
    store = Store.open(":memory:")
    keeper = AlertKeeper(None, store, FakeClock(), LeaderGate(), lambda c: c.close(), lambda: 60.0)
    rest = Next(ActionResult(Outcome.RESUMED))
    await SafetyLimits(safety(store), Hold(store, keeper, lambda c: c.close()))(attempt("resume"), rest)
    assert [a.gate for a in rest.seen] == [None] and store.breaker.since("gpu", 0) == []


# ---------------------------------------------------------------------------------------------- execute


async def test_execute_runs_the_handler() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    store, clock = Store.open(":memory:"), FakeClock()
    keeper = AlertKeeper(None, store, clock, LeaderGate(), lambda c: c.close(), lambda: 60.0)
    runtime = Runtime(None, None, keeper, None, clock, EngineMetrics())
    assert (await Execute(runtime)(attempt("resume"), Next())).outcome == Outcome.NO_SCHEDULER
    assert (await Execute(runtime)(attempt("alert"), Next())).outcome == Outcome.NO_ALERTMANAGER
    result = await Execute(runtime)(attempt("log", params={"message": "hello"}), Next())
    assert result == ActionResult(Outcome.LOGGED, "hello")


# ---------------------------------------------------------------------------------------------- record


async def test_record_audits_counts_and_feeds_back_plain_names() -> None:
    store, clock, audit, fed = Store.open(":memory:"), FakeClock(), MemoryAudit(), []
    stage = Record(clock, EngineMetrics(), AuditTrail(audit, store), fed.append)
    await stage(attempt("drain", params={"reason": "x"}), Next())
    (entry,) = audit.entries
    assert (entry.action, entry.outcome, entry.params) == ("drain", "drained", {"reason": "x"})
    assert type(entry.outcome) is str and store.audit.recent(5) == [entry]
    (event,) = fed
    assert isinstance(event, Event) and event.kind == "watchd_action"
    assert event.attrs == {"action": "drain", "outcome": "drained", "rule": "r", "mode": "enforce"}


async def test_record_feeds_back_an_action_driven_again_from_its_intent() -> None:
    """After a restart or a failover an unfinished action is driven again from its intent, without its
    decision: its outcome is fed back all the same (a reset not done must reach the rule that reboots
    instead); an action no rule decided (an operator's, an engine-made one) still is not."""
    store, clock, audit, fed = Store.open(":memory:"), FakeClock(), MemoryAudit(), []
    stage = Record(clock, EngineMetrics(), AuditTrail(audit, store), fed.append)
    not_reset = Next(ActionResult(Outcome.NOT_RESET, "the agent instance b refused it"))
    redriven = attempt("gpu_reset", decision=None, redrive=True, note="re-driven after a restart")
    await stage(redriven, not_reset)
    (event,) = fed
    assert (event.kind, event.node) == ("watchd_action", "gpu-1")
    assert event.attrs == {"action": "gpu_reset", "outcome": "not_reset", "rule": "r", "mode": "enforce"}
    later = attempt("gpu_reset", decision=None, redrive=True)
    later.now = 200.0  # the next incident of the node (its intent under the same key), driven again
    await stage(later, not_reset)
    assert len({e.id for e in fed}) == 2, "each re-drive is its own event (never de-duplicated away)"
    await stage(attempt("resume", decision=None), Next())
    assert len(fed) == 2


async def test_record_turns_a_crash_into_failed_and_still_audits() -> None:
    store, audit = Store.open(":memory:"), MemoryAudit()

    async def crash(a: Attempt) -> ActionResult:
        raise RuntimeError("boom")

    result = await Record(FakeClock(), EngineMetrics(), AuditTrail(audit, store), None)(
        attempt("drain"), crash
    )
    assert result.outcome == Outcome.FAILED and "internal error: RuntimeError('boom')" in result.detail
    assert [e.outcome for e in audit.entries] == ["failed"]


# ---------------------------------------------------------------------------------------------- one gate


async def test_the_executor_asks_leadership_before_every_side_effect() -> None:
    fake, sink = FakeScheduler(), FakeAlertSink()
    fake.add_nodes(["gpu-1"])
    audit = MemoryAudit()
    lead = FakeLeadership(leads=False, holder="engine-b", takeover_wait_s=0.01)
    executor = ActionExecutor(
        fake,
        "enforce",
        FakeClock(),
        EngineMetrics(),
        audit,
        alerts=sink,
        limits=BreakerLimits(max_fraction=1.0, max_nodes=10_000),
        pools=Pools.from_members({"all": ["gpu-1"]}),
        leadership=lead,
    )
    actions = (
        PlannedAction("drain", "gpu-1", {"reason": "Xid 79"}),
        PlannedAction("requeue", "gpu-1", {}),
        PlannedAction("alert", "gpu-1", {"summary": "s"}),
        PlannedAction("log", "gpu-1", {"message": "m"}),
    )
    async with executor:
        executor.submit(decision(*actions), 0.0)
        await executor.drain_in_flight(5)
        assert (await executor.release(1, "alice")).outcome == Outcome.NOT_HELD
    assert [(e.action, e.outcome) for e in audit.entries] == [
        ("drain", "failed"),
        ("requeue", "skipped"),  # the drain it follows did nothing
        ("alert", "failed"),
        ("log", "logged"),
    ]
    assert (
        audit.entries[0].detail
        == "drain of gpu-1: not the leader (the lease is held by engine-b); nothing done"
    )
    assert fake.calls == [] and sink.calls == []


async def test_dry_run_requeue_after_a_drain_the_breaker_would_hold_is_not_counted() -> None:
    """Issue 16 item 7: the drain would have been held, so its requeue would never happen: not counted."""
    store = Store.open(":memory:")
    store.breaker.record("dry-run:gpu", "gpu-9", 99.0)
    gate = safety(store, max_nodes=1)
    drained = await DryRun(gate)(attempt("drain", mode="dry-run"), Next())
    assert "would hold it" in drained.detail
    requeue = attempt("requeue", mode="dry-run", params={"job": "42"}, after_drain=drained.outcome)
    requeue.check_safety = False  # as FollowTheDrain leaves it
    result = await DryRun(gate)(requeue, Next())
    assert result.outcome == Outcome.DRY_RUN and "the drain it follows would be held" in result.detail
    assert store.breaker.since("dry-run:gpu", 0) == [("gpu-9", 99.0)]  # still one node, not gpu-1
    assert store.breaker.count("dry-run:rule:r", 0) == 0


async def test_dry_run_requeue_after_a_drain_let_through_is_counted() -> None:
    store = Store.open(":memory:")
    gate = safety(store)
    drained = await DryRun(gate)(attempt("drain", mode="dry-run"), Next())
    requeue = attempt("requeue", mode="dry-run", params={"job": "42"}, after_drain=drained.outcome)
    requeue.check_safety = False
    result = await DryRun(gate)(requeue, Next())
    assert result.outcome == Outcome.DRY_RUN and "not counted" not in result.detail
    assert store.breaker.count("dry-run:gpu", 0) == 1
