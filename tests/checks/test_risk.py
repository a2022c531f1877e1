"""The risk planner: each factor of the score, the order, the budget and its floor, the switch topology, the
events it counts, and a round with ``planner: risk`` in the service (fake runner, real state database)."""

from __future__ import annotations

import math

import pytest

from tests.checks.test_service import PASS, Harness, config, nodes
from watchd.checks import plan
from watchd.checks.risk import DAY, NodeEvidence, Order, Risk, lemon_posterior, order, score
from watchd.checks.risk_evidence import EventEvidence, evidence_class
from watchd.checks.risk_params import RiskBudget, RiskWeights
from watchd.checks.riskplan import RiskPlanner
from watchd.checks.runner import Availability, RunOutput
from watchd.checks.topology import expand_hostlist, leaf_switches
from watchd.integrations.fake.checks import FakeCheckRunner
from watchd.model.events import Event
from watchd.store.checks import CheckNode

W = RiskWeights()
NOW = 1_800_000_000.0


def test_exposure_is_linear_in_days_since_the_last_pass_and_never_passed_counts_the_floor() -> None:
    a = score("a", NodeEvidence(last_pass=NOW - 2 * DAY), NOW, W, 14 * DAY)
    b = score("b", NodeEvidence(last_pass=NOW - 4 * DAY), NOW, W, 14 * DAY)
    assert b.score == pytest.approx(2 * a.score)
    assert a.score == pytest.approx(W.base_rate_per_node_day * 2)
    assert a.why() == "2.0 days since its last pass" and not a.due
    never = score("n", NodeEvidence(), NOW, W, 14 * DAY)
    assert never.exposure_days == 14 and never.due and never.why() == "never passed"
    assert never.probability == pytest.approx(1 - math.exp(-never.score))


def test_lemon_posterior_from_the_two_rate_mixture() -> None:
    p1, r1 = lemon_posterior(1, W)
    p2, r2 = lemon_posterior(2, W)
    assert p1 == pytest.approx(0.32, abs=0.01) and r1 == pytest.approx(7.1, abs=0.05)  # as docs/checks.md
    assert p2 == pytest.approx(0.90, abs=0.01) and r2 == pytest.approx(18.2, abs=0.05)
    base = score("a", NodeEvidence(last_pass=NOW - DAY), NOW, W)
    lemon = score("a", NodeEvidence(last_pass=NOW - DAY, failures=(NOW - 3 * DAY, NOW - 20 * DAY)), NOW, W)
    assert lemon.score == pytest.approx(base.score * r2)
    assert [t.name for t in lemon.factors()] == ["lemon"] and "2 failures in 28 days" in lemon.why()
    old = score("a", NodeEvidence(last_pass=NOW - DAY, failures=(NOW - 40 * DAY,)), NOW, W)
    assert old.score == base.score  # outside the lemon window


def test_events_count_only_since_the_last_pass_and_within_the_window() -> None:
    last = NOW - 3 * DAY
    base = score("a", NodeEvidence(last_pass=last), NOW, W)
    hw = score("a", NodeEvidence(last_pass=last, hardware=(NOW - DAY, NOW - 2 * DAY)), NOW, W)
    assert hw.score == pytest.approx(base.score * W.hardware_event_ratio)
    assert "2 hardware events since its last pass (last 24 h ago) x3.0" in hw.why()
    before = score("a", NodeEvidence(last_pass=last, hardware=(NOW - 4 * DAY,), nic=(NOW - 5 * DAY,)), NOW, W)
    assert before.score == base.score  # the pass came after them
    nic = score("a", NodeEvidence(last_pass=NOW - 30 * DAY, nic=(NOW - 8 * DAY, NOW - 6 * DAY)), NOW, W)
    assert nic.score == pytest.approx(
        score("a", NodeEvidence(last_pass=NOW - 30 * DAY), NOW, W).score * W.nic_event_ratio
    )
    assert "1 NIC errors" in nic.why()  # the one 8 days ago is outside the 7-day window


def test_switch_peers_and_repair() -> None:
    base = score("a", NodeEvidence(last_pass=NOW - 2 * DAY), NOW, W)
    peers = score("a", NodeEvidence(last_pass=NOW - 2 * DAY, peers_failed=("b", "c")), NOW, W)
    assert peers.score == pytest.approx(base.score * W.switch_peer_ratio)
    assert "peers on its switch failed (b, c)" in peers.why()
    repaired = score("a", NodeEvidence(last_pass=NOW - 2 * DAY, repaired_at=NOW - DAY), NOW, W)
    assert (
        repaired.score == pytest.approx(base.score * W.repair_ratio)
        and "back from repair 24 h" in repaired.why()
    )
    passed_since = score("a", NodeEvidence(last_pass=NOW - 1 * 3600, repaired_at=NOW - DAY), NOW, W)
    assert [t.name for t in passed_since.terms] == ["exposure"]  # checked since the repair: nothing to add
    long_ago = score("a", NodeEvidence(last_pass=NOW - 20 * DAY, repaired_at=NOW - 10 * DAY), NOW, W)
    assert [t.name for t in long_ago.terms] == ["exposure"]


def test_order_due_first_then_score_then_name() -> None:
    risks = [
        score("quiet", NodeEvidence(last_pass=NOW - 5 * DAY), NOW, W, 14 * DAY),
        score("xid", NodeEvidence(last_pass=NOW - 2 * DAY, hardware=(NOW - 3600,)), NOW, W, 14 * DAY),
        score("due", NodeEvidence(last_pass=NOW - 15 * DAY), NOW, W, 14 * DAY),
        score("never", NodeEvidence(), NOW, W, 14 * DAY),
        score("also-quiet", NodeEvidence(last_pass=NOW - 5 * DAY), NOW, W, 14 * DAY),
    ]
    # 2 days x3 (6) > 5 days (5): the node with the Xid goes first
    assert [r.node for r in order(risks)] == ["due", "never", "xid", "also-quiet", "quiet"]


def _risk(node: str, due: bool = False) -> Risk:
    return Risk(node, 0.1, 15.0 if due else 1.0, due, ())


def test_budget_admits_in_order_until_spent_and_the_floor_goes_past_it() -> None:
    o = Order([_risk("a"), _risk("b"), _risk("c", due=True)], {"a": 1.5, "b": 1.5, "c": 1.5}, {"gpu": 2.0})
    assert o.admit("a", ["gpu"]) is None
    assert o.admit("b", ["gpu"]) == "beyond the budget (1.50 GPU-hours, 0.50 left)"
    assert o.admit("c", ["gpu"]) is None and o.admitted_over == {"c"}  # due: checked whatever is left
    both = Order([_risk("x")], {"x": 1.0}, {"p1": 5.0, "p2": 0.5})
    assert both.admit("x", ["p1", "p2"]) is not None  # a node in two partitions needs room in both
    assert Order([_risk("x")], {"x": 99.0}, None).admit("x", ["gpu"]) is None  # no budget: order only


def test_pick_follows_the_order_and_passes_over_what_the_budget_does_not_reach() -> None:
    cands = {n: ("gpu",) for n in ("a", "b", "c", "d")}
    avail = {n: Availability(n != "b", "" if n != "b" else "node is allocated", ("gpu",)) for n in cands}
    state = {n: CheckNode("nccl", n, "r", 0.0, "passed", 0.0, 0, 0.0) for n in cands}
    o = Order([_risk("d"), _risk("b"), _risk("a"), _risk("c")], dict.fromkeys(cands, 1.0), {"gpu": 2.0})
    chosen = plan.pick(cands, avail, state, running={}, done=set(), limits={"gpu": 4}, now=1.0, order=o)
    assert chosen.start == [("d", "gpu"), ("a", "gpu")]  # b is busy (it waits), c is beyond the budget
    assert chosen.waiting == {"b": "node is allocated"} and list(chosen.passed_over) == ["c"]


def test_topology_conf_leaf_switches() -> None:
    assert expand_hostlist("gpu-[01-03,07],cpu1") == ["gpu-01", "gpu-02", "gpu-03", "gpu-07", "cpu1"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    text = """# from slurm's topology.conf man page
SwitchName=s0 Nodes=tux[0-1]
SwitchName=s1 Nodes=tux[2-3]   # a comment
switchname=s2 nodes=tux4
SwitchName=spine Switches=s[0-2]
"""
    assert leaf_switches(text) == {"tux0": "s0", "tux1": "s0", "tux2": "s1", "tux3": "s1", "tux4": "s2"}
    with pytest.raises(ValueError):
        expand_hostlist("tux[3-1]")


def _event(kind: str, t: float, **attrs: object) -> Event:
    return Event(id=f"{kind}{t}", node="n1", source="test", kind=kind, time=t, attrs=dict(attrs))  # type: ignore[arg-type]


def test_the_events_counted_and_one_per_episode() -> None:
    assert evidence_class(_event("xid", 0, xid=79, bucket="RESTART_BM")) == "hardware"
    assert evidence_class(_event("xid", 0, xid=13, bucket="RESTART_APP")) is None  # an application's Xid
    assert evidence_class(_event("ib_port_health", 0, condition="link_errors", value=40)) == "nic"
    assert evidence_class(_event("ib_port_health", 0, condition="link_errors", value=0)) is None  # cleared
    assert evidence_class(_event("nccl_warn", 0, category="ib_completion")) == "nic"
    assert evidence_class(_event("nccl_warn", 0, category="socket")) is None
    ev = EventEvidence(episode_s=3600)
    for t in (0.0, 60.0, 3000.0, 7200.0):  # a condition reported again while it holds
        ev.observe(_event("ib_port_health", t, condition="port_down", value=1))
    assert ev.of("n1", "nic") == (0.0, 7200.0) and ev.of("n1", "hardware") == ()


# ------------------------------------------------------------------------------------------- the service


def _risk_harness(n: int, **spec: object) -> tuple[Harness, FakeCheckRunner, RiskPlanner]:
    runner = FakeCheckRunner(nodes(n), lambda job: RunOutput("completed", PASS, 0))
    h = Harness(config(planner="risk", **spec), runner)
    planner = RiskPlanner(h.service.config, h.store, h.clock)
    h.service.order = planner.order
    return h, runner, planner


async def _pass_everyone(h: Harness, runner: FakeCheckRunner) -> None:
    """A first round (no budget in the way) so every node has a pass, then time goes on."""
    order, h.service.order = h.service.order, None
    await h.service.run_round("nccl")
    h.service.order = order
    runner.submitted.clear()
    h.events.clear()


async def test_a_risk_round_starts_the_riskiest_idle_node_first_and_stops_at_the_budget() -> None:
    # 10 nodes, one at a time (max_share 0.1), a run costs 60 s x 8 GPUs = 0.133 GPU-hours: 3 fit in 0.4
    h, runner, planner = _risk_harness(10, max_share=0.1, budget={"gpu_hours": 0.4, "per": "1d"})
    await _pass_everyone(h, runner)
    h.clock.advance(3 * DAY)
    now = h.clock.now()
    planner.evidence.add("n007", "hardware", now - 3600)  # an Xid of a hardware bucket an hour ago
    planner.evidence.add("n002", "nic", now - 7200)
    planner.evidence.add("n005", "hardware", now - 3600)
    runner.nodes["n005"].state = "allocated"  # the riskiest, but busy: it waits
    h.store.reliability.add_failure(now - 5 * DAY, "n004", "xid-79", "e1", "xid 79", 0, "drained")
    summary = await h.service.run_round("nccl")
    # spent: the first round's 10 runs took no time on the fake clock, so the whole 0.4 is left
    # the lemon term (x7.1) beats an event (x3); n002 and n007 tie (x3 each): by name
    assert [j.node for j in runner.submitted] == ["n004", "n002", "n007"]
    assert summary["passed_over"]["n000"].startswith("beyond the budget")
    assert "n005" in summary["not_idle"]


async def test_the_floor_checks_a_node_not_passed_for_max_interval_past_the_budget() -> None:
    h, runner, _ = _risk_harness(4, max_share=1.0, budget={"gpu_hours": 0.01, "max_interval": "2d"})
    await _pass_everyone(h, runner)
    h.clock.advance(DAY)
    summary = await h.service.run_round("nccl")
    assert runner.submitted == [] and len(summary["passed_over"]) == 4  # 0.13 GPU-hours > 0.01
    h.clock.advance(1.5 * DAY)  # 2.5 days since the pass: every node is due
    await h.service.run_round("nccl")
    assert sorted(j.node for j in runner.submitted) == ["n000", "n001", "n002", "n003"]


async def test_oldest_first_stays_the_default() -> None:
    runner = FakeCheckRunner(nodes(3), lambda job: RunOutput("completed", PASS, 0))
    h = Harness(config(), runner)
    planner = RiskPlanner(h.service.config, h.store, h.clock)
    h.service.order = planner.order
    assert h.service.config.items[0].planner == "oldest_first"
    assert planner.order(h.service.config.items[0], {"n000": ("gpu",)}) is None
    await h.service.run_round("nccl")
    assert len(runner.submitted) == 3


def test_budget_config_is_strict() -> None:
    with pytest.raises(ValueError):
        config(planner="risk", budget={"gpu_hours": 0})
    with pytest.raises(ValueError):
        config(planner="sometimes")
    assert RiskBudget(gpu_hours=10, per="12h").per == 43200.0  # type: ignore[arg-type]
