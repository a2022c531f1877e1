import asyncio
from typing import Any

import pytest

from tests.support import xid_event
from watchd.actions.audit import MemoryAudit
from watchd.actions.executor import ActionExecutor, Mode, Pools
from watchd.actions.safety import BreakerLimits
from watchd.clock import FakeClock
from watchd.engine.metrics import EngineMetrics
from watchd.integrations.base import SchedulerError
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.events import Event
from watchd.rules import RuleEngine, parse_rule_file

RULES = """
rules:
  - name: xid-fatal-hardware
    match: {kind: xid, xid: {in: [48, 64, 74, 79, 95, 119, 140]}}
    actions:
      - drain: {reason: "Xid {{ xid }} GPU {{ pci_bus_id }} {{ meaning }}"}
      - requeue
  - name: xid-application
    match: {kind: xid, xid: {in: [13, 31, 43]}}
    actions: [log]
"""


def rule_engine(text: str = RULES) -> RuleEngine:
    rules, problems = parse_rule_file(text, "test-rules.yaml")
    assert not problems, [str(p) for p in problems]
    return RuleEngine(tuple(rules))


def make(
    scheduler: FakeScheduler | None, mode: Mode = "enforce", **kw: Any
) -> tuple[ActionExecutor, MemoryAudit, FakeClock]:
    clock = kw.pop("clock", None) or FakeClock()
    audit = MemoryAudit()
    kw.setdefault("limits", BreakerLimits(max_fraction=1.0, max_nodes=10_000))
    if scheduler is not None:
        kw.setdefault("pools", Pools.from_members({"all": list(scheduler.nodes)}))
    return ActionExecutor(scheduler, mode, clock, EngineMetrics(), audit, cooldown_s=600, **kw), audit, clock


def outcomes(audit: MemoryAudit) -> list[tuple[str, str, str]]:
    return [(a.action, a.node, a.outcome) for a in audit.entries]


async def run(executor: ActionExecutor, *events: object) -> None:
    rules = rule_engine()
    async with executor:
        for event in events:
            for decision in rules.evaluate(event):  # type: ignore[arg-type]
                executor.submit(decision, 0.0)
        await executor.drain_in_flight(5)


async def test_enforce_drains_and_requeues() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2"])
    fake.add_job("10", ["gpu-1", "gpu-2"], requeue=True)
    fake.add_job("11", ["gpu-1"], requeue=False)
    executor, audit, _ = make(fake)
    await run(executor, xid_event("gpu-1"))
    assert outcomes(audit) == [("drain", "gpu-1", "drained"), ("requeue", "gpu-1", "requeued")]
    assert fake.nodes["gpu-1"].reason == "watchd: Xid 79 GPU 0000:3b:00.0 GPU has fallen off the bus"
    assert fake.jobs["10"].state == "pending"
    assert "not requeueable 11" in audit.entries[1].detail
    assert not fake.nodes["gpu-2"].drained


async def test_dry_run_touches_nothing() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    executor, audit, _ = make(fake, "dry-run")
    await run(executor, xid_event("gpu-1"))
    assert outcomes(audit) == [("drain", "gpu-1", "dry_run"), ("requeue", "gpu-1", "dry_run")]
    assert fake.calls == []
    assert "would drain gpu-1: watchd: Xid 79" in audit.entries[0].detail


async def test_admin_drain_is_untouched_and_its_jobs_too() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    fake.add_job("10", ["gpu-1"])
    fake.set_admin_drain("gpu-1", "maintenance: bad fan")
    executor, audit, _ = make(fake)
    await run(executor, xid_event("gpu-1"))
    assert outcomes(audit) == [("drain", "gpu-1", "skipped"), ("requeue", "gpu-1", "skipped")]
    assert fake.nodes["gpu-1"].reason == "maintenance: bad fan"
    assert fake.jobs["10"].state == "running"


async def test_repeat_within_cooldown_is_deduplicated_and_later_allowed() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    executor, audit, clock = make(fake)
    rules = rule_engine()
    async with executor:
        for eid in ("a", "b"):
            for d in rules.evaluate(xid_event("gpu-1", event_id=eid)):
                executor.submit(d, 0.0)
        await executor.drain_in_flight(5)
        assert [o for *_, o in outcomes(audit)].count("deduplicated") == 2
        assert len(fake.calls_of("drain")) == 1
        clock.advance(601)
        for d in rules.evaluate(xid_event("gpu-1", event_id="c")):
            executor.submit(d, 0.0)
        await executor.drain_in_flight(5)
    assert outcomes(audit)[-2][2] == "already_drained"


async def test_a_node_resumed_within_the_cooldown_is_drained_again_on_its_next_fault() -> None:
    """De-duplication holds while the node is still drained; once an operator (or the scheduler) returns
    it to service, a new fault drains it and requeues its new job. A flood on a drained node costs one
    state read per 10 s, not one per event."""
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    fake.add_job("10", ["gpu-1"], requeue=True)
    executor, audit, clock = make(fake)
    rules = rule_engine()

    async def fault(eid: str) -> None:
        for d in rules.evaluate(xid_event("gpu-1", event_id=eid)):
            executor.submit(d, 0.0)
        await executor.drain_in_flight(5)

    async with executor:
        await fault("a")
        for i in range(20):  # the flood on the drained node: de-duplicated, one state read
            clock.advance(0.1)
            await fault(f"flood-{i}")
        assert len(fake.calls_of("drain")) == 1
        assert len(fake.calls_of("node_states")) == 2  # the drain's own read, then one recheck
        assert (await fake.resume("gpu-1")).outcome == "resumed"  # the operator, straight to the scheduler
        fake.add_job("11", ["gpu-1"], requeue=True)
        clock.advance(300)
        await fault("b")
    assert outcomes(audit)[-2:] == [("drain", "gpu-1", "drained"), ("requeue", "gpu-1", "requeued")]
    assert fake.nodes["gpu-1"].drained and fake.jobs["11"].state == "pending"


async def test_a_replacing_drain_follows_the_drain_it_replaces_and_is_not_counted_again() -> None:
    """The lemon rule fires right after the drain that made the node a lemon, within that drain's cooldown:
    it still sets its reason, and the breaker (one node here) does not count the node twice."""
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2"])
    executor, audit, _ = make(fake, limits=BreakerLimits(max_fraction=1.0, max_nodes=1))
    rules = rule_engine(
        RULES
        + """
  - name: lemon
    match: {kind: lemon}
    actions:
      - drain: {reason: "lemon node", replace_reason: true}
"""
    )

    def lemon(node: str, eid: str) -> Event:
        return Event(id=eid, node=node, source="watchd", kind="lemon", time=0.0, attrs={})

    async with executor:
        await decide(executor, rules, xid_event("gpu-1", event_id="a"))
        await decide(executor, rules, lemon("gpu-1", "l1"))
        assert fake.nodes["gpu-1"].reason == "watchd: lemon node"
        assert [o for a, n, o in outcomes(audit) if a == "drain"] == ["drained", "drained"]
        assert "replacing 'watchd: Xid 79" in audit.entries[-1].detail
        await decide(executor, rules, lemon("gpu-1", "l2"))  # the same reason again: de-duplicated
        await decide(executor, rules, lemon("gpu-2", "l3"))  # not drained: a new drain, and the breaker's 2nd
    assert [o for a, n, o in outcomes(audit) if a == "drain"][2:] == ["deduplicated", "held"]
    assert not fake.nodes["gpu-2"].drained


async def test_a_requeue_that_names_a_job_requeues_only_that_job() -> None:
    """The job of a finding: one job requeued of the two on the node; another job's requeue on the same
    node is its own action (not de-duplicated by the first); an event without a job requeues nothing."""
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    fake.add_job("41", ["gpu-1"], requeue=True)
    fake.add_job("42", ["gpu-1"], requeue=True)
    executor, audit, _ = make(fake)
    rules = rule_engine(
        """
rules:
  - name: hang
    match: {kind: nccl_hang}
    actions:
      - requeue: {job: "{{ job }}"}
"""
    )

    def hang(eid: str, **attrs: Any) -> Event:
        return Event(id=eid, node="gpu-1", source="detector", kind="nccl_hang", time=0.0, attrs=attrs)

    async with executor:
        await decide(executor, rules, hang("h1", job="slurm:42"))
        assert fake.jobs["42"].state == "pending" and fake.jobs["41"].state == "running"
        await decide(executor, rules, hang("h2", job="41"), hang("h3"))
    assert [(a.outcome, a.detail) for a in audit.entries] == [
        ("requeued", "requeued 42"),
        ("requeued", "requeued 41"),
        ("skipped", "the requeue names a job, and the event does not say which"),
    ]


async def test_a_deduplicated_drain_in_dry_run_reads_no_state() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    executor, audit, clock = make(fake, mode="dry-run")
    rules = rule_engine()
    async with executor:
        for eid in ("a", "b", "c"):
            clock.advance(20)
            for d in rules.evaluate(xid_event("gpu-1", event_id=eid)):
                executor.submit(d, 0.0)
            await executor.drain_in_flight(5)
    assert [o for a, _, o in outcomes(audit) if a == "drain"] == ["dry_run", "deduplicated", "deduplicated"]
    assert fake.calls_of("node_states") == []


async def test_failed_drain_is_reported_and_retried_on_next_event() -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    fake.error = SchedulerError("scontrol: exit status 1: Unable to contact slurm controller")
    executor, audit, _ = make(fake)
    rules = rule_engine()
    async with executor:
        for d in rules.evaluate(xid_event("gpu-1", event_id="a")):
            executor.submit(d, 0.0)
        await executor.drain_in_flight(5)
        assert outcomes(audit)[0][2] == "failed"
        assert "Unable to contact slurm controller" in audit.entries[0].detail
        assert outcomes(audit)[1][2] == "skipped"
        fake.error = None
        for d in rules.evaluate(xid_event("gpu-1", event_id="b")):
            executor.submit(d, 0.0)
        await executor.drain_in_flight(5)
    assert outcomes(audit)[2] == ("drain", "gpu-1", "drained")


async def test_burst_is_coalesced_into_few_scheduler_rounds() -> None:
    fake = FakeScheduler()
    names = [f"sim-{i}" for i in range(150)]
    fake.add_nodes(names)
    executor, _, _ = make(fake)
    await run(executor, *(xid_event(n, event_id=n) for n in names))
    assert all(fake.nodes[n].drained for n in names)
    assert len(fake.calls_of("drain")) <= 3
    assert len(fake.calls_of("update_drain")) <= 3  # one reason: one update per round


async def test_no_scheduler_in_enforce_is_reported() -> None:
    executor, audit, _ = make(None)
    await run(executor, xid_event("gpu-1"))
    assert outcomes(audit)[0] == ("drain", "gpu-1", "no_scheduler")


@pytest.mark.parametrize("code", [13, 31, 43])
async def test_application_xid_is_logged_only(code: int) -> None:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    executor, audit, _ = make(fake)
    await run(executor, xid_event("gpu-1", code))
    assert outcomes(audit) == [("log", "gpu-1", "logged")]
    assert fake.calls == []


# ------------------------------------------------------------------------------------------------- safety

SAFETY_RULES = """
rules:
  - name: fatal
    match: {kind: xid, xid: 79}
    actions:
      - drain: {reason: "Xid {{ xid }}"}
      - requeue
      - alert: {summary: "Xid {{ xid }} on {{ node }}"}
  - name: limited
    match: {kind: xid, xid: 48}
    rate_limit: {max: 2, per: 1h}
    actions: [drain]
  - name: careful
    match: {kind: xid, xid: 64}
    mode: dry-run
    actions: [drain]
  - name: back-in-service
    match: {kind: node_repaired}
    actions: [resume]
"""


async def decide(executor: ActionExecutor, engine: RuleEngine, *events: Any) -> None:
    for event in events:
        for d in engine.evaluate(event):
            executor.submit(d, 0.0)
    await executor.drain_in_flight(5)


def pool_of(n: int) -> FakeScheduler:
    fake = FakeScheduler()
    fake.add_nodes([f"n{i}" for i in range(n)])
    fake.partitions = {"gpu": [f"n{i}" for i in range(n)]}
    return fake


async def test_breaker_holds_the_n_plus_first_drain_and_keeps_alerting() -> None:
    from watchd.actions.executor import Pools
    from watchd.integrations.alerts import FakeAlertSink

    fake = pool_of(20)
    alerts = FakeAlertSink()
    limits = BreakerLimits(max_fraction=0.10, max_nodes=50, window_s=3600)  # 10% of 20 = 2 nodes
    executor, audit, clock = make(
        fake, limits=limits, alerts=alerts, pools=Pools.from_members(await fake.pools())
    )
    engine = rule_engine(SAFETY_RULES)
    async with executor:
        await decide(executor, engine, *(xid_event(f"n{i}", event_id=f"e{i}") for i in range(3)))
        drained = sorted(n for n, st in fake.nodes.items() if st.drained)
        assert len(drained) == 2
        held = executor.store.held.list()
        assert [(h.kind, h.pool) for h in held] == [("drain", "gpu")]
        assert "blast-radius breaker" in held[0].reason and held[0].event["node"] == held[0].node
        # the held node's jobs are left alone, its alert still fires, and the breaker alert fires too
        by_node = {(a.node, a.action): a.outcome for a in audit.entries}
        assert by_node[(held[0].node, "requeue")] == "skipped"
        assert by_node[(held[0].node, "alert")] == "fired"
        await executor.drain_in_flight(1)
        assert "breaker/gpu" in alerts.firing
        assert alerts.firing["breaker/gpu"].labels["alertname"] == "WatchdBlastRadiusBreakerOpen"
        # an operator releases it: it runs past the breaker
        result = await executor.release(held[0].id, "alice")
        assert result.outcome == "drained" and fake.nodes[held[0].node].drained
        assert (await executor.release(held[0].id, "alice")).outcome == "not_held"
        # an hour later the window has moved on
        clock.advance(3601)
        await decide(executor, engine, xid_event("n10", event_id="late"))
        assert fake.nodes["n10"].drained


async def test_a_node_already_drained_by_someone_else_neither_counts_nor_is_held() -> None:
    from watchd.actions.executor import Pools

    fake = pool_of(10)  # 10% of 10 = 1 node
    fake.set_admin_drain("n0", "maintenance")
    executor, audit, _ = make(
        fake, limits=BreakerLimits(0.10, 50, 3600), pools=Pools.from_members(await fake.pools())
    )
    async with executor:
        await decide(
            executor, rule_engine(SAFETY_RULES), xid_event("n0", event_id="a"), xid_event("n1", event_id="b")
        )
    assert {(a.node, a.action): a.outcome for a in audit.entries if a.action == "drain"} == {
        ("n0", "drain"): "skipped",
        ("n1", "drain"): "drained",
    }
    assert executor.store.held.list() == []


async def test_the_breaker_alert_pages_while_anything_is_held_and_resolves_when_nothing_is() -> None:
    from watchd.actions.executor import Pools
    from watchd.integrations.alerts import FakeAlertSink

    fake = pool_of(20)
    alerts = FakeAlertSink()
    limits = BreakerLimits(max_fraction=0.10, max_nodes=50, window_s=0.05)  # 2 nodes; a 50 ms window
    executor, _, _ = make(fake, limits=limits, alerts=alerts, pools=Pools.from_members(await fake.pools()))
    async with executor:
        await decide(
            executor, rule_engine(SAFETY_RULES), *(xid_event(f"n{i}", event_id=f"e{i}") for i in range(4))
        )
        first, second = executor.store.held.list()
        await asyncio.sleep(0.3)  # the window passed several times: still paging, two are held
        assert "breaker/gpu" in alerts.firing
        executor.discard(first.id, "bob")
        await asyncio.sleep(0.1)
        assert "breaker/gpu" in alerts.firing  # one is still held
        executor.discard(second.id, "bob")
        await executor.drain_in_flight(1)
        await asyncio.sleep(0.01)
        assert "breaker/gpu" not in alerts.firing and "breaker/gpu" in alerts.resolved


async def test_two_gpus_of_one_node_page_twice_and_a_repeat_refreshes() -> None:
    """Alerts are told apart as Alertmanager does, by their labels: a second GPU's Xid on the node is a
    second page (it used to replace, and so resolve, the first); the same GPU again refreshes its page."""
    from watchd.integrations.alerts import FakeAlertSink

    alerts = FakeAlertSink()
    executor, _, _ = make(None, alerts=alerts)
    rules = rule_engine(
        """
rules:
  - name: xid-alert
    match: {kind: xid}
    actions:
      - alert: {summary: "Xid {{ xid }}", labels: {pci_bus_id: "{{ pci_bus_id }}"}}
"""
    )
    async with executor:
        await decide(
            executor,
            rules,
            xid_event("gpu-1", event_id="a", pci_bus_id="0000:3b:00.0"),
            xid_event("gpu-1", event_id="b", pci_bus_id="0000:5d:00.0"),
            xid_event("gpu-1", event_id="c", pci_bus_id="0000:3b:00.0"),
        )
        firing = sorted(a.labels["pci_bus_id"] for a in alerts.firing.values())
    assert firing == ["0000:3b:00.0", "0000:5d:00.0"] and not alerts.resolved
    assert [c[0] for c in alerts.calls] == ["fire", "fire", "fire"]


async def test_discarded_held_action_never_runs() -> None:
    from watchd.actions.executor import Pools

    fake = pool_of(10)
    executor, _, _ = make(
        fake, limits=BreakerLimits(0.10, 50, 3600), pools=Pools.from_members(await fake.pools())
    )
    async with executor:
        await decide(
            executor, rule_engine(SAFETY_RULES), *(xid_event(f"n{i}", event_id=f"e{i}") for i in range(2))
        )
        (held,) = executor.store.held.list()
        assert executor.discard(held.id, "bob").outcome == "discarded"
        assert (await executor.release(held.id, "bob")).outcome == "not_held"
        last = executor.store.audit.recent(1)[0]  # the durable trail says who discarded what
        assert (last.action, last.node, last.outcome) == ("drain", held.node, "discarded")
        assert "discarded by bob" in last.detail
    assert not fake.nodes[held.node].drained


async def test_rule_rate_limit_holds_beyond_its_budget() -> None:
    fake = pool_of(10)
    executor, audit, _ = make(fake)
    async with executor:
        await decide(
            executor, rule_engine(SAFETY_RULES), *(xid_event(f"n{i}", 48, event_id=f"e{i}") for i in range(3))
        )
    assert [a.outcome for a in audit.entries].count("drained") == 2
    (held,) = executor.store.held.list()
    assert "rate limit of rule limited" in held.reason


async def test_per_rule_dry_run_under_an_enforcing_engine() -> None:
    fake = pool_of(2)
    executor, audit, _ = make(fake)
    async with executor:
        await decide(executor, rule_engine(SAFETY_RULES), xid_event("n0", 64))
    assert [(a.action, a.mode, a.outcome) for a in audit.entries] == [("drain", "dry-run", "dry_run")]
    assert not fake.nodes["n0"].drained


async def test_resume_only_what_watchd_drained() -> None:
    from watchd.model.events import Event

    fake = pool_of(2)
    fake.set_admin_drain("n1", "maintenance")
    executor, audit, _ = make(fake)
    engine = rule_engine(SAFETY_RULES)
    async with executor:
        await decide(executor, engine, xid_event("n0", event_id="x"))
        assert fake.nodes["n0"].drained
        repaired = [
            Event(id=f"r{n}", node=n, source="t", kind="node_repaired", time=1.0) for n in ("n0", "n1")
        ]
        await decide(executor, engine, *repaired)
    resumes = {a.node: a.outcome for a in audit.entries if a.action == "resume"}
    assert resumes == {"n0": "resumed", "n1": "refused"}
    assert not fake.nodes["n0"].drained and fake.nodes["n1"].reason == "maintenance"


async def test_state_survives_a_restart(tmp_path: Any) -> None:
    from watchd.store.database import Store

    fake = pool_of(4)
    db = tmp_path / "engine.db"
    store = Store.open(db)
    executor, _, clock = make(fake, store=store)
    engine = rule_engine(SAFETY_RULES)
    async with executor:
        await decide(executor, engine, xid_event("n0", event_id="a"))
    store.close()
    # A crash between decision and scheduler call leaves an unfinished intent behind: simulate one.
    crashed = Store.open(db)
    crashed.intents.begin("drain:n3", "drain", "n3", "fatal", "z", {"reason": "Xid 79"}, clock.now())
    crashed.close()
    fake.calls.clear()
    store = Store.open(db)
    executor, audit, _ = make(fake, store=store, clock=clock)
    async with executor:
        await executor.drain_in_flight(5)
        assert fake.nodes["n3"].drained, "the unfinished drain is re-driven once"
        await decide(executor, engine, xid_event("n0", event_id="b"))  # same node, within the cooldown
    assert [a.outcome for a in audit.entries if a.node == "n0" and a.action == "drain"] == ["deduplicated"]
    assert store.intents.unfinished() == []
    assert next(a.node for a in store.audit.recent(100) if a.action == "drain") == "n0"
    store.close()


async def test_webhook_action_posts_the_decision() -> None:
    from aiohttp import web

    from watchd.integrations.webhook.sender import WebhookSender

    received: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response({})

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/hook", hook)
    app.router.add_post("/slow", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    rules = f"""
rules:
  - name: notify
    labels: {{team: sre}}
    match: {{kind: xid}}
    actions:
      - webhook: {{url: "http://127.0.0.1:{port}/hook", headers: {{X-Token: abc}}}}
      - webhook: {{url: "http://127.0.0.1:{port}/slow", timeout_s: 0.2, retries: 0}}
"""
    try:
        async with WebhookSender() as sender:  # its own timeout is 5 s: the rule's 0.2 s must win
            executor, audit, _ = make(None, webhooks=sender)
            async with executor:
                await decide(executor, rule_engine(rules), xid_event("gpu-5", 79))
    finally:
        await runner.cleanup()
    assert [(a.action, a.outcome) for a in audit.entries] == [("webhook", "delivered"), ("webhook", "failed")]
    assert "1 attempt(s) timed out after 0.2s" in audit.entries[1].detail
    (payload,) = received
    assert payload["rule"] == "notify" and payload["node"] == "gpu-5" and payload["labels"] == {"team": "sre"}
    assert payload["event"]["attrs"]["xid"] == 79


# ------------------------------------------------------- found in review: the breaker must not be bypassed


async def test_a_released_drain_counts_and_its_requeue_runs() -> None:
    fake = pool_of(20)  # 10% of 20 = 2
    fake.add_job("7", ["n2"])
    executor, _, clock = make(
        fake, limits=BreakerLimits(0.10, 50, 3600), pools=Pools.from_members(await fake.pools())
    )
    engine = rule_engine(SAFETY_RULES)
    async with executor:
        await decide(executor, engine, *(xid_event(f"n{i}", event_id=f"e{i}") for i in range(3)))
        (held,) = executor.store.held.list()
        assert held.node == "n2" and fake.jobs["7"].state == "running"
        result = await executor.release(held.id, "alice")
        assert result.outcome == "drained" and "then requeue: requeued" in result.detail
        drain, requeue = executor.store.audit.recent(2)  # each step audited as it ran, under the rule
        assert (drain.node, drain.action, drain.outcome, drain.rule) == ("n2", "drain", "drained", "fatal")
        assert drain.detail.startswith("released by alice") and drain.event_id == f"held-{held.id}"
        assert (requeue.action, requeue.outcome, requeue.result["requeued"]) == ("requeue", "requeued", ["7"])
        assert fake.jobs["7"].state == "pending"
        clock.advance(60)
        await decide(executor, engine, xid_event("n3", event_id="e3"))  # three taken out: the window is full
        assert not fake.nodes["n3"].drained
        assert [h.node for h in executor.store.held.list()] == ["n3"]


async def test_a_repeated_event_adds_no_second_held_row() -> None:
    fake = pool_of(10)  # 10% of 10 = 1
    executor, _, clock = make(
        fake, limits=BreakerLimits(0.10, 50, 3600), pools=Pools.from_members(await fake.pools())
    )
    engine = rule_engine(SAFETY_RULES)
    async with executor:
        await decide(executor, engine, xid_event("n0", event_id="a"), xid_event("n1", event_id="b"))
        clock.advance(30)
        await decide(executor, engine, xid_event("n1", event_id="c"))
    assert [h.node for h in executor.store.held.list()] == ["n1"]


async def test_dry_run_holds_nothing_and_says_what_the_limits_would_do() -> None:
    from watchd.integrations.alerts import FakeAlertSink

    fake = pool_of(10)
    alerts = FakeAlertSink()
    executor, audit, _ = make(
        fake,
        "dry-run",
        limits=BreakerLimits(0.10, 50, 3600),
        alerts=alerts,
        pools=Pools.from_members(await fake.pools()),
    )
    async with executor:
        await decide(
            executor, rule_engine(SAFETY_RULES), xid_event("n0", event_id="a"), xid_event("n1", event_id="b")
        )
    drains = [a for a in audit.entries if a.action == "drain"]
    assert [a.outcome for a in drains] == ["dry_run", "dry_run"]
    assert "would hold it: blast-radius breaker" in drains[1].detail
    assert executor.store.held.list() == [] and "breaker/gpu" not in alerts.firing


async def test_a_crash_between_a_drain_and_its_requeue_still_requeues_after_the_restart(
    tmp_path: Any,
) -> None:
    """The drain finished, the engine died before the requeue began (no intent of it yet): the restarted
    engine requeues, once; a drain whose requeue did happen, or that drained nothing, is left alone. An
    unfinished drain is re-driven and then requeued."""
    from watchd.store.database import Store

    fake = pool_of(4)
    for i in range(4):
        fake.add_job(f"j{i}", [f"n{i}"], requeue=True)
    db = tmp_path / "engine.db"
    clock_now = 1_700_000_000.0
    follows = {"reason": "Xid 79", "requeue_follows": True}
    with Store.open(db) as crashed:
        for node, outcome in (("n0", "drained"), ("n1", "drained"), ("n2", "skipped")):
            crashed.intents.begin(f"drain:{node}", "drain", node, "fatal", f"e-{node}", follows, clock_now)
            crashed.intents.finish(f"drain:{node}", outcome, "", clock_now)
        crashed.intents.begin("requeue:n1", "requeue", "n1", "fatal", "e-n1", {}, clock_now + 1)
        crashed.intents.finish("requeue:n1", "requeued", "", clock_now + 1)
        crashed.intents.begin("drain:n3", "drain", "n3", "fatal", "e-n3", follows, clock_now)  # unfinished
    from watchd.clock import FakeClock

    store = Store.open(db)
    executor, audit, _ = make(fake, store=store, clock=FakeClock(clock_now + 5))
    async with executor:
        await executor.drain_in_flight(5)
        await asyncio.sleep(0.05)
        await executor.drain_in_flight(5)
    recovered = [a for a in audit.entries if a.detail.startswith("recovered after a restart")]
    requeued = {a.node: a.outcome for a in audit.entries if a.action == "requeue" and a not in recovered}
    assert requeued == {"n0": "requeued", "n3": "requeued"}, requeued
    # the intents finished before the crash but never audited (here: all three) get their audit record
    assert sorted((a.node, a.action, a.outcome) for a in recovered) == [
        ("n0", "drain", "drained"),
        ("n1", "drain", "drained"),
        ("n1", "requeue", "requeued"),
        ("n2", "drain", "skipped"),
    ]
    assert fake.jobs["j0"].state == "pending" and fake.jobs["j3"].state == "pending"
    assert fake.jobs["j1"].state == "running" and fake.jobs["j2"].state == "running"
    assert all(a.rule == "fatal" for a in audit.entries if a.action == "requeue")
    store.close()


async def test_interrupted_drains_are_redriven_through_the_breaker(tmp_path: Any) -> None:
    from watchd.store.database import Store

    fake = pool_of(20)  # 10% of 20 = 2
    db = tmp_path / "engine.db"
    with Store.open(db) as crashed:
        for i in range(5):
            crashed.intents.begin(
                f"drain:n{i}", "drain", f"n{i}", "fatal", f"e{i}", {"reason": "Xid 79"}, 1e9
            )
    store = Store.open(db)
    executor, _, _ = make(
        fake, store=store, limits=BreakerLimits(0.10, 50, 3600), pools=Pools.from_members(await fake.pools())
    )
    async with executor:
        await executor.drain_in_flight(5)
    assert sum(st.drained for st in fake.nodes.values()) == 2
    assert len(store.held.list()) == 3 and store.intents.unfinished() == []
    store.close()


def test_a_pool_of_unknown_size_allows_one() -> None:
    assert BreakerLimits(0.10, 50, 3600).allowed_in(0) == 1
    assert BreakerLimits(0.10, 50, 3600).allowed_in(1000) == 50
    assert BreakerLimits(0.10, 50, 3600).allowed_in(5) == 1
