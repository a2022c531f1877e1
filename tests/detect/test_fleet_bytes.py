"""Issue 16 item 8: the detectors' fleet state is bounded by bytes, not only by count. The estimate
(watchd/detect/fleet_bytes.py) is held to what CPython really allocates, the running count to a recount, and
the bound to what a flood of new node ids leaves behind."""

from __future__ import annotations

import gc
import random
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchd.detect.fleet import FleetState
from watchd.model.events import Event

_rng = random.Random(8)


def _summary(node: str, gpu: int, t: float, pci: str | None = None, job: str | None = None) -> Event:
    attrs: dict[str, object] = {
        "gpu": gpu,
        "util_mean": 99.0,
        "power_mean": 650.0 + _rng.random(),
        "sm_clock_mean": 1455.0 + _rng.random(),
        "pcie_tx_mean": 1e9 * _rng.random(),
        "window_s": 5,
    }
    if pci is not None:
        attrs["pci_bus_id"] = pci
    if job is not None:
        attrs["job"] = job
    return Event(id="s", node=node, source="nvml", kind="gpu_summary", time=t, attrs=attrs)


def _xid(node: str, t: float) -> Event:
    attrs = {"xid": 13, "bucket": "RESTART_APP", "pci_bus_id": "0000:3b:00.0", "text": "SM Warp Exception"}
    return Event(id="x", node=node, source="kmsg", kind="xid", time=t, attrs=attrs)


def _lost(node: str, gpu: int, t: float, value: int = 1) -> Event:
    attrs = {"condition": "gpu_lost", "gpu": gpu, "value": value, "evidence": "NVML: GPU is lost"}
    return Event(id="l", node=node, source="nvml", kind="gpu_health", time=t, attrs=attrs)


def _heartbeat(node: str, job: str, rank: int, t: float) -> Event:
    attrs = {"job": job, "rank": rank, "step": int(t), "step_time_s": 1.0 + _rng.random()}
    return Event(id="h", node=node, source="heartbeat", kind="heartbeat", time=t, attrs=attrs)


def _names(n: int) -> list[str]:
    return [f"r{_rng.getrandbits(64):016x}" for _ in range(n)]


WORKLOADS: dict[str, Callable[[list[str]], list[Event]]] = {
    "a node, one GPU, one window": lambda ns: [_summary(n, 0, 1000.0) for n in ns],
    "8 GPUs": lambda ns: [_summary(n, g, 1000.0) for n in ns[:500] for g in range(8)],
    "60 windows, PCI map, job": lambda ns: [
        _summary(n, g, 1000.0 + 5 * i, pci=f"0000:{g:02x}:00.0", job="j1")
        for i in range(60)
        for n in ns[:25]
        for g in range(4)
    ],
    "64 Xids a node": lambda ns: [_xid(n, 1000.0 + i) for i in range(64) for n in ns[:100]],
    "4 lost GPUs": lambda ns: [_lost(n, g, 1000.0) for n in ns for g in range(4)],
    "8 ranks a node": lambda ns: [
        _heartbeat(n, f"job{k % 50}", k * 8 + r, 1000.0 + s)
        for s in range(10)
        for k, n in enumerate(ns[:200])
        for r in range(8)
    ],
}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_estimate_is_close_to_what_is_allocated(workload: str) -> None:
    events = WORKLOADS[workload](_names(1500))
    fleet = FleetState()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for e in events:
            fleet.observe(e)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    allocated = sum(d.size_diff for d in after.compare_to(before, "filename"))
    ratio = allocated / fleet.bytes
    assert 0.7 < ratio < 1.4, f"{workload}: {allocated} B allocated, {fleet.bytes} B estimated"


def test_new_node_ids_past_the_byte_budget_evict_the_least_recent_nodes() -> None:
    fleet = FleetState(max_bytes=2 * 1024 * 1024)
    names = _names(20_000)
    for i, name in enumerate(names):
        fleet.observe(_summary(name, 0, 1000.0 + i * 0.001))
        assert fleet.bytes <= fleet.max_bytes
    kept = {n["node"] for n in fleet.nodes(1020.0)[0]}
    assert 2000 < len(kept) < 5000
    assert fleet.evicted["node"] == len(names) - len(kept)
    assert kept == set(names[-len(kept) :]), "not the least recently reporting nodes were evicted"
    # everything of an evicted node went: no GPU, rank or topology entry is left behind
    assert {node for node, _ in fleet.gpus} == kept


def test_an_evicted_nodes_ranks_go_with_it() -> None:
    fleet = FleetState(max_nodes=2)
    fleet.observe(_heartbeat("a", "j1", 0, 1000.0))
    fleet.observe(_heartbeat("b", "j1", 1, 1001.0))
    fleet.observe(_summary("c", 0, 1002.0))
    assert set(fleet.ranks["j1"]) == {1}
    assert fleet.evicted["node"] == 1


def test_a_node_larger_than_the_budget_alone_is_kept() -> None:
    fleet = FleetState(max_bytes=1000)
    for g in range(8):
        fleet.observe(_summary("big", g, 1000.0))
    assert {node for node, _ in fleet.gpus} == {"big"}
    assert fleet.bytes > fleet.max_bytes


_ops = st.lists(
    st.tuples(
        st.sampled_from(["summary", "xid", "lost", "found", "heartbeat", "prune", "forget"]),
        st.integers(0, 5),  # node
        st.integers(0, 3),  # gpu / rank
        st.integers(1, 400),  # seconds since the previous step
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_running_count_equals_a_recount(ops: list[tuple[str, int, int, int]]) -> None:
    fleet = FleetState(max_nodes=4, history_s=60.0, rank_ttl_s=120.0)
    t = 1000.0
    for op, n, g, dt in ops:
        t += dt
        node = f"n{n}"
        if op == "summary":
            fleet.observe(_summary(node, g, t, pci=f"0000:{g:02x}:00.0"))
        elif op == "xid":
            fleet.observe(_xid(node, t))
        elif op in ("lost", "found"):
            fleet.observe(_lost(node, g, t, value=1 if op == "lost" else 0))
        elif op == "heartbeat":
            fleet.observe(_heartbeat(node, "job", g, t))  # the same rank from another node: it moved
        elif op == "prune":
            fleet.prune(t)
        else:
            fleet.forget_node(node)
        running = fleet.bytes
        fleet._recount()
        assert running == fleet.bytes, f"after {op} on {node}"
        assert running >= 0
