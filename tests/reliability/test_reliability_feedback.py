"""The engine's side (watchd/engine/reliability.py) on an in-memory state database and a fake clock: which
drain outcomes are failures, once per time out of service, and the durable record they leave."""

from __future__ import annotations

import asyncio

from watchd.clock import FakeClock
from watchd.jobs.topology import JobTopology
from watchd.model.action import ActionFeedback
from watchd.model.events import Event
from watchd.reliability.settings import ReliabilityConfig
from watchd.reliability.subsystem import Reliability
from watchd.rules.decision import Decision, PlannedAction
from watchd.store.database import Store
from watchd.store.reliability import PAGE


def make() -> tuple[Reliability, Store, FakeClock]:
    store = Store.open(":memory:")
    clock = FakeClock(start=10_000.0)
    return Reliability(ReliabilityConfig(), store, clock, JobTopology(), lambda n: ["batch"]), store, clock


def xid(node: str, t: float, code: int = 79, bucket: str = "RESTART_BM") -> Event:
    return Event(f"x{t}", node, "kmsg", "xid", t, {"xid": code, "bucket": bucket})


def drain(rel: Reliability, event: Event, outcome: str, rule: str = "xid-fatal-hardware") -> None:
    action = PlannedAction("drain", event.node, {"reason": "r"})  # type: ignore[arg-type]
    rel.decided(Decision(rule, "critical", event, (action,), {}, {}))
    feedback = ActionFeedback(action="drain", outcome=outcome, rule=rule, mode="dry-run")
    rel.feedback(feedback.to_event(id=f"f{event.id}", node=event.node, source="watchd", time=event.time + 1))


def test_a_drain_on_hardware_evidence_is_one_failure_until_the_node_is_back() -> None:
    rel, store, _ = make()
    for t in range(0, 3601, 60):
        rel.observe(Event(f"s{t}", "n1", "nvml", "gpu_summary", float(t), {"gpu": 0, "job": "slurm:1"}))
    drain(rel, xid("n1", 1000.0), "dry_run")
    drain(rel, xid("n1", 2000.0), "dry_run")  # dry-run never drained it: the same fault, not a second failure
    drain(rel, xid("n1", 2100.0, 13, "RESTART_APP"), "dry_run")  # an application Xid: no failure
    drain(rel, xid("n1", 2200.0), "deduplicated")
    assert [f.time for f in store.reliability.failures(0.0)] == [1000.0]
    rel.observe(Event("s9", "n1", "nvml", "gpu_summary", 5000.0, {"gpu": 0, "job": "slurm:2"}))  # back
    [failure] = store.reliability.failures(0.0)
    assert failure.back_at == 5000.0 and failure.evidence == "xid 79 (RESTART_BM)"
    drain(rel, xid("n1", 6000.0), "drained")
    assert len(store.reliability.failures(0.0)) == 2
    report = rel.report(now=7000.0, since=0.0)
    assert report.fleet.failures == 2 and report.fleet.exposure_s == 1000.0  # 0-1000; 5000-5000
    assert report.partitions["batch"].failures == 2


def test_a_held_or_failed_drain_and_a_drain_without_evidence_are_no_failures() -> None:
    rel, store, _ = make()
    drain(rel, xid("n1", 100.0), "held")
    drain(rel, xid("n2", 100.0), "failed")
    hang = Event("h", "n3", "detector", "nccl_hang", 100.0, {"hardware": False, "job": "slurm:1"})
    drain(rel, hang, "drained", rule="hang-no-hardware-culprit")
    assert store.reliability.failures(0.0) == []


def test_the_record_survives_a_restart() -> None:
    store = Store.open(":memory:")
    clock = FakeClock(start=10_000.0)
    rel = Reliability(ReliabilityConfig(), store, clock, JobTopology(), lambda n: [])
    for t in range(0, 601, 60):
        rel.observe(Event(f"s{t}", "n1", "nvml", "gpu_summary", float(t), {"gpu": 3, "model": "H200"}))
    drain(rel, xid("n1", 600.0), "drained")
    rel.flush_now()
    again = Reliability(ReliabilityConfig(), store, clock, JobTopology(), lambda n: [])
    assert again.service.nodes["n1"].out_since == 600.0  # still out after the restart
    report = again.report(now=1000.0, since=0.0)
    assert report.fleet.failures == 1 and report.fleet.exposure_s == 600.0
    assert report.info["n1"].gpus == 1 and report.info["n1"].model == "H200"  # the GPUs it reported


def test_the_periodic_cycle_serves_the_event_loop_and_reports_what_the_blocking_one_does() -> None:
    """The engine's cycle saves and reads in pages with the loop served between them and builds the report
    in a thread: a drain decided meanwhile waits for one page, not the whole fleet. Same report as the
    blocking form."""
    nodes = 2 * PAGE + 10  # three pages of nodes and of intervals
    rel, store, _ = make()
    twin, twin_store, _ = make()
    for r in (rel, twin):
        for t in (9_000.0, 9_060.0):
            for n in range(nodes):
                r.observe(Event(f"s{n}-{t}", f"n{n}", "nvml", "gpu_summary", t, {"gpu": 0, "model": "H200"}))
    drain(rel, xid("n7", 9_500.0), "drained")
    drain(twin, xid("n7", 9_500.0), "drained")

    async def run() -> int:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        start = ticks
        await rel.cycle()
        done.set()
        await task
        return ticks - start

    served = asyncio.run(run())
    twin.cycle_now()
    assert served >= 9  # 3 pages written (intervals and nodes together), 3 + 3 + 1 read, then the thread
    got, want = rel._report, twin._report
    assert got is not None and want is not None and got.to_dict() == want.to_dict()
    assert got.fleet.failures == 1 and len(got.nodes) == nodes and got.fleet.exposure_s == nodes * 60.0
    assert len(store.reliability.nodes()) == len(twin_store.reliability.nodes()) == nodes
