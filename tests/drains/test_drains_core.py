"""The pure core of ``watchd drains`` and the hot spares: owner and reason classes, ages, availability, and
the spare planner's promises (never more than configured, never a busy node) as properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchd.fleetview.drains import (
    AGE_BUCKETS,
    OWNERS,
    REASON_CLASSES,
    FleetNode,
    age_bucket,
    availability,
    classify_owner,
    classify_reason,
    unavailable_nodes,
)
from watchd.fleetview.spares import pick_release, plan, plan_replenish, plan_trim


def drained(
    name: str, reason: str | None, state: str = "idle", flags: tuple[str, ...] = ("DRAIN",), **kw: object
) -> FleetNode:
    return FleetNode(
        name=name,
        scheduler="slurm",
        partitions=("gpu",),
        state=state,
        flags=frozenset(flags),
        reason=reason,
        **kw,
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reason", "state", "flags", "owner", "reason_class"),
    [
        ("watchd: Xid 79 GPU 0000:3b:00.0 GPU has fallen off the bus", "idle", ("DRAIN",), "watchd", "xid"),
        # the default pack's reasons, made to fit sinfo -R's 20 characters
        (
            "watchd: Xid79 3b:00 GPU has fallen off the bus (GPU 0000:3b:00.0)",
            "idle",
            ("DRAIN",),
            "watchd",
            "xid",
        ),
        ("watchd: Xid154 3b:00 needs GPU_RESET (GPU 0000:3b:00.0)", "idle", ("DRAIN",), "watchd", "xid"),
        (
            "watchd: GPU3 lost (NVML: GPU is lost; GPU 0000:3b:00.0)",
            "idle",
            ("DRAIN",),
            "watchd",
            "gpu_health",
        ),
        (
            "watchd: GPU3 ECC DBE: volatile DBE count 2 (GPU 0000:3b:00.0)",
            "idle",
            ("DRAIN",),
            "watchd",
            "gpu_health",
        ),
        (
            "watchd: GPU3 reset needed: retired_pages_pending (GPU 0:3b)",
            "idle",
            ("DRAIN",),
            "watchd",
            "gpu_health",
        ),
        (
            "watchd: hang GPU5 gpu_lost: NCCL hang of job slurm:42 (xid 79)",
            "idle",
            ("DRAIN",),
            "watchd",
            "hang",
        ),
        (
            "watchd: slow GPU2 -30% sm_clock: straggler of job slurm:42",
            "idle",
            ("DRAIN",),
            "watchd",
            "straggler",
        ),
        ("watchd: nccl hang in job slurm:12, culprit gpu-3", "mixed", ("DRAIN",), "watchd", "hang"),
        ("watchd: lemon node: implicated twice in 28 days", "idle", ("DRAIN",), "watchd", "lemon"),
        ("watchd: GPU 2 row-remap failure", "idle", ("DRAIN",), "watchd", "gpu_health"),
        ("NHC: check_hw_eth: eth0 missing", "idle", ("DRAIN",), "nhc", "nhc"),
        ("Not responding", "down", ("NOT_RESPONDING",), "scheduler", "not_responding"),
        ("Kill task failed", "idle", ("DRAIN",), "scheduler", "kill_task_failed"),
        ("Node unexpectedly rebooted", "down", (), "scheduler", "unexpected_reboot"),
        ("Prolog error", "idle", ("DRAIN",), "scheduler", "prolog_epilog"),
        (
            "Low RealMemory (reported:1000 < 100.00% of configured:2000)",
            "idle",
            ("DRAIN",),
            "scheduler",
            "config_mismatch",
        ),
        ("swap DIMM B3 -- ticket 4711", "idle", ("DRAIN",), "admin", "admin"),
        ("nhc: lower case is a person, not NHC", "idle", ("DRAIN",), "admin", "admin"),
        (None, "down", (), "other", "unknown"),
    ],
)
def test_owner_and_reason_classes(
    reason: str | None, state: str, flags: tuple[str, ...], owner: str, reason_class: str
) -> None:
    node = drained("n1", reason, state, flags)
    assert node.out_of_service
    assert classify_owner(node) == owner
    assert classify_reason(classify_owner(node), node) == reason_class
    assert reason_class in REASON_CLASSES


def test_kubernetes_owners() -> None:
    ours = FleetNode(
        "k1",
        "kubernetes",
        ("H100",),
        flags=frozenset({"CORDONED"}),
        reason="watchd: Xid 48",
        watchd_owned=True,
    )
    unreachable = FleetNode(
        "k2",
        "kubernetes",
        ("H100",),
        state="down",
        flags=frozenset({"FAIL"}),
        reason="node.kubernetes.io/unreachable",
        taints=("node.kubernetes.io/unreachable",),
    )
    cordon = FleetNode(
        "k3",
        "kubernetes",
        ("H100",),
        flags=frozenset({"CORDONED"}),
        reason="cordoned",
        taints=("node.kubernetes.io/unschedulable",),
    )
    assert [classify_owner(n) for n in (ours, unreachable, cordon)] == ["watchd", "scheduler", "admin"]
    assert classify_reason("scheduler", unreachable) == "not_responding"


def test_in_service_nodes_are_not_listed_and_ages_are_bucketed() -> None:
    now = 1_000_000.0
    nodes = [
        FleetNode("up", "slurm", ("gpu",), state="allocated"),
        FleetNode("spare", "slurm", ("gpu",), flags=frozenset({"RESERVED"}), spare=True),
        drained("old", "swap DIMM", since=now - 10 * 86400),
        drained("new", "Kill task failed", since=now - 30),
        drained("when", "NHC: x"),
    ]
    out = unavailable_nodes(nodes, now)
    assert [u.node for u in out] == ["old", "new", "when"]  # oldest first, unknown time last
    assert [u.age_bucket for u in out] == ["30d", "1h", "unknown"]
    assert out[0].state == "IDLE+DRAIN" and out[0].age_s == pytest.approx(10 * 86400)
    [gpu] = availability(nodes)
    assert (gpu.total, gpu.unavailable, gpu.spares) == (5, 3, 1)
    assert gpu.available_share == pytest.approx(2 / 5)
    assert gpu.by_owner == {"admin": 1, "scheduler": 1, "nhc": 1}


def test_a_node_in_two_partitions_is_one_entry_counted_in_each() -> None:
    a = drained("n1", "x")
    b = FleetNode("n1", "slurm", ("debug",), flags=frozenset({"DRAIN"}), reason="x")
    [u] = unavailable_nodes([a, b], 0.0)
    assert u.partitions == ("gpu", "debug")
    assert {p.partition: p.unavailable for p in availability([a, b])} == {"debug": 1, "gpu": 1}


@given(st.one_of(st.none(), st.floats(min_value=0, max_value=1e9)))
def test_age_bucket_is_bounded(age: float | None) -> None:
    assert age_bucket(age) in {label for label, _ in AGE_BUCKETS} | {"unknown"}


@given(st.text(max_size=80), st.sampled_from(["idle", "down", "mixed", "fail"]))
def test_every_reason_gets_a_known_class(reason: str, state: str) -> None:
    node = drained("n", reason or None, state)
    owner = classify_owner(node)
    assert owner in OWNERS
    assert classify_reason(owner, node) in REASON_CLASSES


# ------------------------------------------------------------------------------------------ spares


def node(name: str, state: str = "idle", partition: str = "gpu", **kw: object) -> FleetNode:
    return FleetNode(name, "slurm", (partition,), state=state, **kw)  # type: ignore[arg-type]


def test_replenish_takes_idle_nodes_watchd_resumed_first_and_never_busy_ones() -> None:
    nodes = [
        node("a"),
        node("b", "allocated"),
        node("c"),
        node("d", "mixed"),
        node("e"),
        drained("f", "NHC: x"),
        node("g", reason="maintenance"),
        node("h", partition="cpu"),
    ]
    assert plan_replenish({"gpu": 2}, {}, nodes, preferred=["e"]) == {"gpu": ("e", "a")}
    assert plan_replenish({"gpu": 10}, {}, nodes) == {"gpu": ("a", "c", "e")}  # all the idle ones, no more
    assert plan_replenish({"gpu": 2}, {"gpu": ["a", "c"]}, nodes) == {}


def test_trim_releases_unfit_spares_and_the_excess() -> None:
    nodes = [
        node("a", flags=frozenset({"RESERVED"}), spare=True),
        node("b", "allocated", spare=True),
        node("c", spare=True),
        drained("d", "Kill task failed", spare=True),
    ]
    assert plan_trim({"gpu": 1}, {"gpu": ["a", "b", "c", "d"]}, nodes) == {"gpu": ("b", "d", "c")}
    p = plan({"gpu": 2}, {"gpu": ["b"]}, [*nodes, node("e")])
    assert p.remove == {"gpu": ("b",)}
    assert p.add == {"gpu": ("e",)}  # a and c are spares of no partition held: e is the idle one


def test_pick_release_takes_the_longest_held() -> None:
    assert pick_release(["x", "y"]) == ("x",)
    assert pick_release([]) == ()


names = st.sampled_from([f"n{i}" for i in range(12)])
states = st.sampled_from(["idle", "allocated", "mixed", "down"])


@settings(max_examples=300)
@given(
    st.dictionaries(names, st.tuples(states, st.sampled_from(["p1", "p2"]), st.booleans()), max_size=12),
    st.dictionaries(st.sampled_from(["p1", "p2"]), st.integers(0, 5)),
)
def test_the_spare_plan_never_exceeds_the_count_nor_takes_a_busy_node(
    fleet: dict[str, tuple[str, str, bool]], want: dict[str, int]
) -> None:
    nodes = [node(n, s, p, spare=sp) for n, (s, p, sp) in fleet.items()]
    held: dict[str, list[str]] = {}
    for n in nodes:
        if n.spare:
            held.setdefault(n.partitions[0], []).append(n.name)
    p = plan(want, held, nodes)
    by_name = {n.name: n for n in nodes}
    for partition in set(held) | set(p.add):
        after = [s for s in held.get(partition, []) if s not in p.remove.get(partition, ())]
        after += list(p.add.get(partition, ()))
        assert len(after) <= want.get(partition, 0)
        assert len(set(after)) == len(after)
        assert all(by_name[s].idle for s in after)
    for added in p.add.values():
        assert all(by_name[a].state == "idle" and not by_name[a].spare for a in added)
