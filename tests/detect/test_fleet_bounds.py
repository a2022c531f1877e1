"""Issue 16 items 6 and 8: the fleet state bounded by count whatever the inputs, and its status view
linear in the GPUs tracked (lost GPUs indexed by node)."""

from __future__ import annotations

from watchd.detect.fleet import FleetState
from watchd.model.events import Event, Scalar


def summary(node: str, gpu: int, at: float) -> Event:
    attrs: dict[str, Scalar] = {"gpu": gpu, "util_mean": 99.0, "power_mean": 650.0, "window_s": 5}
    return Event(
        id=f"s-{node}-{gpu}-{at}", node=node, source="nvml", kind="gpu_summary", time=at, attrs=attrs
    )


def lost(node: str, gpu: int, at: float) -> Event:
    attrs: dict[str, Scalar] = {"condition": "gpu_lost", "gpu": gpu, "value": 1, "evidence": "lost"}
    return Event(id=f"l-{node}-{gpu}-{at}", node=node, source="nvml", kind="gpu_health", time=at, attrs=attrs)


def test_the_node_reported_least_recently_is_evicted_first_with_all_its_state() -> None:
    fleet = FleetState(max_nodes=3)
    for i, node in enumerate(["a", "b", "c"]):
        fleet.observe(summary(node, 0, 100.0 + i))
    fleet.observe(lost("a", 1, 104.0))  # a reports again: b is now the oldest
    fleet.observe(summary("d", 0, 105.0))
    assert sorted({n for n, _ in fleet.gpus}) == ["a", "c", "d"] and fleet.evicted["node"] == 1
    fleet.observe(summary("e", 0, 106.0))
    fleet.observe(summary("f", 0, 107.0))  # c, then a: its lost GPU, hardware events and topology go too
    assert sorted({n for n, _ in fleet.gpus}) == ["d", "e", "f"] and fleet.evicted["node"] == 3
    assert fleet.lost == {} and fleet.lost_by_node == {} and "a" not in fleet.hardware
    assert fleet.topology.job_of("a", 0, 107.0) is None


def test_a_gpu_index_past_the_bound_is_refused_and_counted() -> None:
    fleet = FleetState(max_gpus_per_node=8)
    fleet.observe(summary("a", 8, 100.0))
    fleet.observe(lost("a", 1_000_000, 100.0))
    fleet.observe(summary("a", 7, 100.0))
    assert list(fleet.gpus) == [("a", 7)] and fleet.evicted == {"node": 0, "gpu": 2}


def test_nodes_troubled_first_limited_filtered_and_lost_gpus_by_node() -> None:
    fleet = FleetState()
    for i in range(20):
        for gpu in range(2):
            fleet.observe(summary(f"n{i:02d}", gpu, 100.0))
    fleet.observe(lost("n15", 1, 101.0))
    fleet.observe(lost("n15", 0, 101.0))
    fleet.observe(lost("x9", 3, 101.0))  # lost, never summarised: still shown
    shown, total = fleet.nodes(102.0, limit=3)
    assert total == 21 and [n["node"] for n in shown] == ["n15", "x9", "n00"]
    assert shown[0]["lost_gpus"] == [0, 1] and shown[1]["lost_gpus"] == [3] and shown[2]["lost_gpus"] == []
    flagged, _ = fleet.nodes(102.0, limit=2, troubled_first=lambda n: n == "n07")
    assert [n["node"] for n in flagged] == ["n07", "n15"]
    assert [n["node"] for n in fleet.nodes(102.0, node="n1*")[0]] == [
        "n15",
        *(f"n1{i}" for i in range(10) if i != 5),
    ]
    assert fleet.nodes(102.0, node="nope")[1] == 0
    fleet.observe(summary("n15", 1, 103.0))  # reported again: no longer lost
    assert fleet.lost_by_node["n15"] == {0: 101.0} and ("n15", 1) not in fleet.lost
    fleet.prune(1000.0)
    assert fleet.lost == {} and fleet.lost_by_node == {}


def test_window_history_is_trimmed_to_history_s() -> None:
    fleet = FleetState(history_s=20.0)
    for t in range(0, 100, 5):
        fleet.observe(summary("a", 0, float(t)))
    assert [w.end for w in fleet.gpus[("a", 0)].windows] == [75.0, 80.0, 85.0, 90.0, 95.0]
