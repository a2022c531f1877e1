"""Pair checks' attribution (pure): a slow pair is not a verdict on a node; only a node slow with every
partner is at fault, a pair slow only together is a link, and the second pass pairs suspects with nodes that
passed."""

from __future__ import annotations

from pathlib import Path

from tests.checks.test_service import Harness, nodes
from watchd.checks.fabric.pairs import PairRun, attribute, first_groups, first_pairs, next_wave, second_pairs
from watchd.checks.params import ChecksConfig
from watchd.checks.runner import CheckJob, RunOutput
from watchd.integrations.fake.checks import FakeCheckRunner
from watchd.store.database import Store

NODES = [f"gpu-{i}" for i in range(1, 9)]


def run(a: str, b: str, good: bool, bw: float | None = None, judged: bool = True) -> PairRun:
    return PairRun((a, b), good, bw if bw is not None else (380.0 if good else 41.0), "", judged)


def test_first_pairs_keep_a_switch_together_and_leave_an_odd_node_out() -> None:
    assert first_pairs(NODES[:5]) == [("gpu-1", "gpu-2"), ("gpu-3", "gpu-4")]
    switch = {"gpu-1": "s1", "gpu-3": "s1", "gpu-2": "s2", "gpu-4": "s2", "gpu-5": "s3"}
    assert first_pairs(NODES[:5], switch) == [("gpu-1", "gpu-3"), ("gpu-2", "gpu-4")]
    assert first_pairs(NODES[:6], {**switch, "gpu-6": "s4"}) == [
        ("gpu-1", "gpu-3"),
        ("gpu-2", "gpu-4"),
        ("gpu-5", "gpu-6"),  # the odd ones of two switches, across
    ]


def test_a_bad_node_is_found_in_two_waves_and_only_it_fails() -> None:
    first = [run(a, b, good=("gpu-3" not in (a, b))) for a, b in first_pairs(NODES)]
    assert attribute(first).at_fault == {}  # one slow pair blames nobody yet
    assert sorted(attribute(first).unresolved) == ["gpu-3", "gpu-4"]
    second = second_pairs(first, ())
    assert second == [("gpu-3", "gpu-1"), ("gpu-4", "gpu-2")]
    runs = [*first, run("gpu-3", "gpu-1", False), run("gpu-4", "gpu-2", True)]
    att = attribute(runs)
    assert list(att.at_fault) == ["gpu-3"] and [r.partner("gpu-3") for r in att.at_fault["gpu-3"]] == [
        "gpu-4",
        "gpu-1",
    ]
    assert "gpu-4" in att.passed and att.links == [] and att.unresolved == {}
    assert len(runs) == len(NODES) // 2 + 2


def test_a_pair_slow_only_together_is_a_link_and_nobody_fails() -> None:
    runs = [run("gpu-1", "gpu-2", False), run("gpu-3", "gpu-4", True)]
    runs += [run(a, b, True) for a, b in second_pairs(runs, ())]
    att = attribute(runs)
    assert att.at_fault == {} and [r.nodes for r in att.links] == [("gpu-1", "gpu-2")]
    assert sorted(att.passed) == NODES[:4]


def test_nothing_good_anywhere_blames_nobody() -> None:
    # every pair fails (a launcher misconfigured, the fabric manager down everywhere): no partner passed
    runs = [run(a, b, False) for a, b in first_pairs(NODES)]
    assert second_pairs(runs, ()) == []  # no good node to pair with
    att = attribute(runs)
    assert att.at_fault == {} and att.links == [] and len(att.unresolved) == len(NODES)


def test_an_odd_node_gets_a_good_partner_and_needs_two_to_be_blamed() -> None:
    first = [run("gpu-1", "gpu-2", True)]
    wave = second_pairs(first, ["gpu-3"])
    assert wave == [("gpu-3", "gpu-1")]
    runs = [*first, run("gpu-3", "gpu-1", False)]
    assert "gpu-3" in attribute(runs).unresolved  # slow with one partner: could be their link
    wave = second_pairs(runs, ())
    assert wave == [("gpu-3", "gpu-2")]
    runs.append(run("gpu-3", "gpu-2", False))
    assert list(attribute(runs).at_fault) == ["gpu-3"]


def test_runs_that_could_not_be_judged_say_nothing_and_tries_are_bounded() -> None:
    runs = [run("gpu-1", "gpu-2", False, judged=False), run("gpu-3", "gpu-4", True)]
    att = attribute(runs)
    assert att.at_fault == {} and "gpu-1" not in att.unresolved
    tried = [run("gpu-5", p, False) for p in ("gpu-6", "gpu-7", "gpu-8")]
    wave = second_pairs([*tried, run("gpu-1", "gpu-2", True)], (), max_tries=3)
    assert wave == [("gpu-6", "gpu-1"), ("gpu-7", "gpu-2")]  # gpu-5 ran three times: left for a person


# ------------------------------------------------------------------------------ in the service (fake runner)

TWO_NODES = (
    Path(__file__).resolve().parent.parent
    / "data"
    / "checks"
    / "nccl"
    / "h100-2node-16rank-wrong-columns.txt"
).read_text()


SLOW = TWO_NODES.replace("338.82", "41.20").replace("337.35", "40.90")


def pair_config() -> ChecksConfig:
    item = {"name": "fabric", "type": "nccl-pair", "partitions": ["gpu"], "max_share": 0.5, "time_limit": 60}
    return ChecksConfig.model_validate({"enabled": True, "runner": "fake", "items": [item]})


async def test_a_pair_round_in_the_service_respects_the_share_and_blames_one_node() -> None:
    def script(job: CheckJob) -> RunOutput:
        slow = "n002" in job.nodes
        return RunOutput("completed", SLOW if slow else TWO_NODES, 0)

    runner = FakeCheckRunner(nodes(8), script)
    h = Harness(pair_config(), runner)
    summary = await h.service.run_round("fabric")
    assert summary["failed"] == ["n002"] and summary["runs"] == 6, summary
    assert all(len(j.nodes) == 2 for j in runner.submitted)
    assert runner.max_concurrent["gpu"] <= 4  # 50% of 8 nodes: two pairs at once
    results = h.by_node()
    assert results["n002"].outcome == "failed" and results["n002"].partners == "n003,n000"
    assert {n for n, r in results.items() if r.outcome == "passed"} == {f"n{i:03d}" for i in range(8)} - {
        "n002"
    }


async def test_a_pair_run_in_flight_at_restart_is_recorded_never_judged_alone(tmp_path: Path) -> None:
    runner = FakeCheckRunner(nodes(2), lambda job: RunOutput("completed", SLOW, 0))
    store = Store.open(tmp_path / "state.db")
    handle = await runner.submit(CheckJob("fabric", "n000", ("srun",), 60, "r-1", peers=("n001",)))
    store.checks.start("r-1", "fabric", "n000", "fabric@x", 0.0)
    store.checks.submitted("r-1", handle.job_id, handle.output)
    h = Harness(pair_config(), runner, store)
    await h.service.start()
    for task in list(h.service._tasks):
        await task
    assert h.store.checks.unfinished() == [] and h.events == []  # a slow pair alone blames nobody
    assert h.store.checks.history("n000")[0].outcome == "failed"


async def test_pairs_follow_slurms_leaf_switches_when_the_topology_is_given(tmp_path: Path) -> None:
    topology = tmp_path / "topology.conf"
    topology.write_text(
        "SwitchName=leaf1 Nodes=n00[0,2]\n"
        "SwitchName=leaf2 Nodes=n00[1,3]\n"
        "SwitchName=spine Switches=leaf[1-2]\n"
    )
    cfg = pair_config().model_dump(mode="json")
    cfg["risk"]["topology"] = str(topology)
    runner = FakeCheckRunner(nodes(4), lambda job: RunOutput("completed", TWO_NODES, 0))
    h = Harness(ChecksConfig.model_validate(cfg), runner)
    await h.service.run_round("fabric")
    assert sorted(j.nodes for j in runner.submitted) == [("n000", "n002"), ("n001", "n003")]


async def test_validation_without_a_known_good_partner_keeps_the_node_drained() -> None:
    runner = FakeCheckRunner(nodes(3), lambda job: RunOutput("completed", TWO_NODES, 0))
    runner.nodes["n000"].flags.add("DRAIN")
    runner.nodes["n000"].reason = "watchd: ib port_down"
    h = Harness(pair_config(), runner)
    v = await h.service.validate("n000", "validate:1")
    assert (v.done, v.passed) == ("not_checked", False)  # not checked: not a failure of the node
    assert "links not checked: no node has passed fabric yet to pair with" in v.detail
    assert runner.submitted == [] and "DRAIN" in runner.nodes["n000"].flags
    assert (runner.nodes["n000"].reason or "").startswith("watchd: fabric not checked (validate): ")
    assert list(h.service.waiting) == ["n000"]  # tried again once a partner frees up
    # once a round found good nodes, the validation pairs with one, lent to it and given back
    runner.nodes["n000"].flags.add("RESERVED")  # keeps it out of the round
    await h.service.run_round("fabric")
    runner.nodes["n000"].flags.discard("RESERVED")
    v = await h.service.validate("n000", "validate:2")
    assert (v.done, v.passed) == ("resumed", True), v
    assert h.service.waiting == {}
    assert (
        runner.submitted[-1].nodes in (("n000", "n001"), ("n000", "n002")) and runner.submitted[-1].validation
    )
    assert runner.lent == {} and not any(n.reserved for n in runner.nodes.values())


# ------------------------------------------------------------------------------ groups, bisected


def simulate(
    nodes: list[str], size: int, bad: set[str], links: set[frozenset[str]] = frozenset()
) -> list[PairRun]:  # type: ignore[assignment]
    """Every wave of a round until nothing is left to run: a run is slow when it holds a bad node or a bad
    link (both ends)."""
    runs: list[PairRun] = []
    wave = first_groups(nodes, size)
    pending = set(nodes) - {n for g in wave for n in g}
    while wave:
        for g in wave:
            slow = bool(set(g) & bad) or any(link <= set(g) for link in links)
            runs.append(
                run(g[0], g[1], not slow) if len(g) == 2 else PairRun(g, not slow, 41.0 if slow else 380.0)
            )
        wave = next_wave(runs, pending)
        pending = set()
    return runs


def test_a_slow_group_is_bisected_to_its_bad_node_in_log_n_waves() -> None:
    nodes = [f"gpu-{i:02d}" for i in range(1, 17)]
    runs = simulate(nodes, 8, {"gpu-11"})
    att = attribute(runs)
    assert list(att.at_fault) == ["gpu-11"] and att.links == [] and att.unresolved == {}
    assert sorted(att.passed) == sorted(set(nodes) - {"gpu-11"})
    # 2 groups of 8, the bad group's halves (2), their halves (2), the bad pair's nodes each with a good node
    assert len(runs) == 2 + 2 + 2 + 2
    assert runs[2].nodes == ("gpu-09", "gpu-10", "gpu-11", "gpu-12")


def test_a_bad_link_inside_a_group_pages_and_blames_nobody() -> None:
    nodes = [f"gpu-{i}" for i in range(1, 9)]
    runs = simulate(nodes, 4, set(), {frozenset({"gpu-2", "gpu-3"})})
    att = attribute(runs)
    assert att.at_fault == {} and att.unresolved == {}
    assert sorted(r.nodes for r in att.links) == [
        ("gpu-1", "gpu-2", "gpu-3", "gpu-4")
    ]  # the group, not a half
    assert sorted(att.passed) == nodes


async def test_a_group_round_in_the_service_drains_only_the_bad_node() -> None:
    def script(job: CheckJob) -> RunOutput:
        return RunOutput("completed", SLOW if "n005" in job.nodes else TWO_NODES, 0)

    runner = FakeCheckRunner(nodes(8), script)
    cfg = pair_config().model_dump(mode="json")
    cfg["items"][0].update(group_size=4, max_share=1.0)
    h = Harness(ChecksConfig.model_validate(cfg), runner)
    summary = await h.service.run_round("fabric")
    assert summary["failed"] == ["n005"] and summary["runs"] == 6, summary
    assert [len(j.nodes) for j in runner.submitted][:2] == [4, 4]
    evidence = h.by_node()["n005"].evidence
    assert evidence.startswith(
        "nccl 4/2-node busbw 41 GB/s with n004,n006,n007 and busbw 41 GB/s with n004"
    ), evidence


def test_nodes_that_shared_a_group_are_still_new_partners() -> None:
    runs = simulate(["gpu-1", "gpu-2", "gpu-3", "gpu-4"], 4, {"gpu-3"})
    assert [r.nodes for r in runs][-2:] == [("gpu-3", "gpu-1"), ("gpu-4", "gpu-2")]
    assert list(attribute(runs).at_fault) == ["gpu-3"] and len(runs) == 5


async def test_nic_faults_reported_on_the_node_are_in_the_evidence() -> None:
    def script(job: CheckJob) -> RunOutput:
        return RunOutput("completed", SLOW if "n002" in job.nodes else TWO_NODES, 0)

    runner = FakeCheckRunner(nodes(4), script)
    h = Harness(pair_config(), runner)
    now = h.clock.now()
    h.service.nic_seen = {"n002": now - 7200.0, "n001": now - 30 * 86400.0}.get
    await h.service.run_round("fabric")
    evidence = h.by_node()["n002"].evidence
    assert evidence.endswith("fine with others; NIC faults reported on n002 (2 h ago)"), evidence
    assert "NIC" not in h.by_node()["n001"].evidence  # a month ago: not recent
