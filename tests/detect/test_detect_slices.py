"""The detector cycle in slices (watchd/slices.py, fault round finding 7): with many jobs, the event loop
runs other coroutines during one cycle, the findings are the same as the cycle run at once, and what ingest
changes between slices (new nodes, evictions, a prune) does not break the pass. Behaviour, not timing: the
slice budget is set to 0, so the cycle yields at every step."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import watchd.detect.service as service
from watchd.clock import FakeClock
from watchd.detect.correlator import Correlator
from watchd.detect.finding import Finding
from watchd.detect.params import DetectorsConfig
from watchd.detect.service import Detectors
from watchd.jobs.model import JobInfo
from watchd.jobs.settings import JobsConfig
from watchd.jobs.topology import JobTopology
from watchd.model.events import Event, Scalar, stable_id
from watchd.slices import run_all, run_sliced

WS = 5.0
T0 = 1000.0
JOBS = 120  # healthy 4-GPU jobs besides the three with a condition
# util, power, link, SM clock
LEVELS = {
    "compute": (97.0, 560.0, 1e11, 1980.0),
    "spin": (100.0, 245.0, 2e5, 1980.0),
    "idle": (0.0, 90.0, 1e4, 345.0),
}


def window(node: str, gpu: int, t: float, job: str, state: str, clock: float | None = None) -> Event:
    util, power, link, sm_clock = LEVELS[state]
    attrs: dict[str, Scalar] = {
        "gpu": gpu,
        "job": job,
        "model": "NVIDIA H100 80GB HBM3",
        "window_s": WS,
        "util_mean": util,
        "power_mean": power,
        "sm_clock_mean": sm_clock if clock is None else clock,
        "nvlink_tx_mean": link / 2,
        "nvlink_rx_mean": link / 2,
        "thermal_frac": 0.9 if clock is not None else 0.0,
    }
    return Event(stable_id(node, "gpu_summary", gpu, t), node, "nvml", "gpu_summary", t, attrs)


def fleet_events(t: float, faulty: bool) -> list[Event]:
    """One window of every GPU at ``t``: ``JOBS`` healthy jobs (agent-labelled, one node of 4 GPUs each) and,
    once ``faulty``, a hung job, a job stalled on its hosts and a job with one thermally slowed GPU."""
    out = []
    for j in range(JOBS):
        out += [window(f"h{j}", g, t, f"slurm:{j}", "compute") for g in range(4)]
    for g in range(8):
        node = f"hang-{g // 4}"
        out.append(window(node, g % 4, t, "slurm:hang", "spin" if faulty and g != 5 else "compute"))
        out.append(window(f"stall-{g // 4}", g % 4, t, "slurm:stall", "idle" if faulty else "compute"))
        slow = 1700.0 if faulty and g == 3 else None
        out.append(window(f"slow-{g // 4}", g % 4, t, "slurm:slow", "compute", clock=slow))
    return out


def correlator() -> Correlator:
    c = Correlator(DetectorsConfig(), JobTopology(60.0))
    c.topology.replace("slurm", [JobInfo("slurm:hang", ("hang-0", "hang-1"), "slurm", partition="gpu")])
    return c


class Probe:
    """A coroutine that counts its turns on the event loop while the work runs."""

    def __init__(self, on_turn: Callable[[int], None] = lambda turn: None) -> None:
        self.turns = 0
        self.on_turn = on_turn

    async def around(self, work: Coroutine[Any, Any, Any]) -> Any:
        done = False

        async def count() -> None:
            while not done:
                self.turns += 1
                self.on_turn(self.turns)
                await asyncio.sleep(0)

        task = asyncio.create_task(count())
        await asyncio.sleep(0)
        self.turns = 0
        try:
            return await work
        finally:
            done = True
            await task


def test_a_cycle_in_slices_finds_what_the_cycle_at_once_finds_and_lets_the_loop_run() -> None:
    at_once, sliced = correlator(), correlator()
    found_at_once: list[Finding] = []
    found_sliced: list[Finding] = []
    turns: list[int] = []
    t = T0
    for i in range(60):  # 5 minutes: the warm-up, then each condition past its own for_s
        t += WS
        for e in fleet_events(t, faulty=i >= 12):
            at_once.observe(e)
            sliced.observe(e)
        found_at_once += at_once.run(t)
        probe = Probe()
        found_sliced += asyncio.run(probe.around(run_sliced(sliced.steps(t), budget_s=0.0)))
        turns.append(probe.turns)
    assert found_sliced == found_at_once
    assert {f.kind for f in found_at_once} == {"nccl_hang", "host_stall", "straggler"}
    assert min(turns) > JOBS  # the loop ran between the jobs of every cycle, not once after it


def test_the_detectors_subsystem_yields_during_one_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "SLICE_S", 0.0)
    emitted: list[Event] = []

    async def emit(event: Event) -> None:
        emitted.append(event)

    clock = FakeClock(start=T0)
    detectors = Detectors(DetectorsConfig(), JobsConfig(), clock, CollectorRegistry(), emit)
    twin = correlator()
    detectors.correlator.topology.replace("slurm", [JobInfo("slurm:hang", ("hang-0", "hang-1"), "slurm")])
    twin.topology.replace("slurm", [JobInfo("slurm:hang", ("hang-0", "hang-1"), "slurm")])
    turns = []
    want: list[Finding] = []
    for i in range(30):
        clock.advance(WS)
        for e in fleet_events(clock.now(), faulty=i >= 8):
            detectors.observe(e)
            twin.observe(e)
        probe = Probe()
        asyncio.run(probe.around(detectors.detect()))
        turns.append(probe.turns)
        want += twin.run(clock.now())
    assert min(turns) > JOBS
    assert [e.id for e in emitted] == [f.to_event().id for f in want]
    assert "nccl_hang" in {e.kind for e in emitted}
    assert detectors.last_cycle.slices > JOBS and detectors.last_cycle.busy_s > 0.0


def test_ingest_and_eviction_between_slices_do_not_break_the_cycle_or_the_prune() -> None:
    c = correlator()
    c.fleet.max_nodes = JOBS + 8  # new nodes evict the least recently reporting ones meanwhile
    t = T0
    for _ in range(10):
        t += WS
        for e in fleet_events(t, faulty=False):
            c.observe(e)
    new = iter(range(10_000))

    def ingest(turn: int) -> None:  # a new node, a new job every turn: evicts an old node each time
        n = next(new)
        c.observe(window(f"new-{n}", 0, t, f"slurm:new-{n}", "compute"))

    probe = Probe(ingest)
    findings = asyncio.run(probe.around(run_sliced(c.steps(t), budget_s=0.0)))
    assert findings == [] and probe.turns > JOBS and c.fleet.evicted["node"] > JOBS // 2
    before = {node for node, _ in c.fleet.gpus}
    asyncio.run(Probe(ingest).around(run_sliced(c.prune_steps(t + 400.0), budget_s=0.0)))
    left = {node for node, _ in c.fleet.gpus}
    assert left and not left & before  # all older than history_s gone; what was observed meanwhile kept
    assert c.fleet.bytes == sum(c.fleet._node_bytes.values())  # the count is whole after the prune


def test_the_job_views_in_steps_are_the_views_at_once_and_ignore_what_is_observed_meanwhile() -> None:
    topology = JobTopology(60.0)
    topology.replace("slurm", [JobInfo(f"slurm:{j}", (f"n{j}",), "slurm", partition="p") for j in range(50)])
    for j in range(5_000):
        topology.observe_gpu(f"n{j % 4000}", j // 4000, f"slurm:{j % 4000}", T0)
    want = topology.jobs(T0)
    steps = topology.job_steps(T0, step=100)
    next(steps)
    for j in range(100):  # observed after the pass began: counts from the next pass on
        topology.observe_gpu(f"late{j}", 0, f"slurm:late{j}", T0)
    assert run_all(steps) == want
    assert topology.last_sizes == (T0, {k: (len(v.nodes), v.partition) for k, v in want.items()})
    assert "slurm:late0" in topology.jobs(T0)
