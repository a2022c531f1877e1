"""``GET /api/v1/reliability`` off the event loop (fault round finding 7; watchd/reliability/cached.py): the
fleet's report is the one the cycle built, rebuilt on request only when older than 2 x ``interval_s``; a
query's (``since``, ``partition``) is kept as long; one build at a time; each document says its age, and the
loop runs while a report is built."""

from __future__ import annotations

import asyncio
from typing import Any

from watchd.clock import FakeClock
from watchd.jobs.model import JobInfo
from watchd.jobs.topology import JobTopology
from watchd.model.events import Event
from watchd.reliability.settings import ReliabilityConfig
from watchd.reliability.subsystem import Reliability
from watchd.store.database import Store
from watchd.store.reliability import PAGE

NODES = PAGE + 10  # two pages of nodes and of intervals


def make(topology: JobTopology | None = None) -> tuple[Reliability, FakeClock]:
    clock = FakeClock(start=10_000.0)
    rel = Reliability(
        ReliabilityConfig(interval_s=60.0),
        Store.open(":memory:"),
        clock,
        topology or JobTopology(),
        lambda n: [],
    )
    for t in (9_000.0, 9_060.0):
        for n in range(NODES):
            rel.observe(Event(f"s{n}-{t}", f"n{n}", "nvml", "gpu_summary", t, {"gpu": 0, "model": "H200"}))
    rel.flush_now()  # the durable record a query reads (it does not flush first)
    return rel, clock


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_fleets_report_is_the_cycles_until_it_is_older_than_twice_interval_s() -> None:
    rel, clock = make()

    async def scenario() -> None:
        await rel.cycle()
        assert rel.reports.builds == 1
        clock.advance(90.0)
        doc = await rel.document({})
        assert rel.reports.builds == 1 and doc["report_age_s"] == 90.0  # served from the cycle's report
        assert doc["fleet"]["exposure_hours"] == NODES * 60.0 / 3600.0 and doc["nodes_total"] == NODES
        clock.advance(31.0)  # 121 s: past 2 x interval_s
        doc = await rel.document({})
        assert rel.reports.builds == 2 and doc["report_age_s"] == 0.0

    run(scenario())


def test_a_query_is_built_once_and_kept_and_requests_share_one_build() -> None:
    rel, clock = make()

    async def scenario() -> None:
        docs = await asyncio.gather(*(rel.document({"since": "1h"}) for _ in range(3)))
        assert rel.reports.builds == 1 and all(d == docs[0] for d in docs)
        await rel.document({"since": "1h", "partition": "batch"})
        assert rel.reports.builds == 2
        clock.advance(60.0)
        await rel.document({"since": "1h"})
        assert rel.reports.builds == 2  # the query as given, a minute later: the same one
        clock.advance(61.0)
        doc = await rel.document({"since": "1h"})
        assert rel.reports.builds == 3 and doc["report_age_s"] == 0.0
        await asyncio.gather(rel.document({}), rel.document({}), rel.document({}))
        assert rel.reports.builds == 4  # no report yet: built once for the three

    run(scenario())


def test_the_loop_runs_while_a_request_builds_the_report() -> None:
    rel, _ = make()

    async def scenario() -> int:
        turns, done = 0, False

        async def count() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(count())
        await asyncio.sleep(0)
        start = turns
        await rel.document({"since": "30d"})
        done = True
        await task
        return turns - start

    assert run(scenario()) >= 6  # 2 + 2 + 1 pages read, then the thread


def test_the_advice_reads_the_job_sizes_of_the_last_pass_when_recent() -> None:
    topology = JobTopology()
    topology.replace("slurm", [JobInfo("slurm:7", ("n1", "n2", "n3"), "slurm", partition="batch")])
    rel, clock = make(topology)
    for t, phase, step in ((9_000.0, "train", 1), (9_100.0, "checkpoint", 2), (9_160.0, "train", 2)):
        attrs = {"job": "slurm:7", "rank": 0, "step": step, "phase": phase}
        rel.observe(Event(f"hb{t}", "n1", "heartbeat", "heartbeat", t, attrs))
    topology.jobs(clock.now())  # the detectors' pass
    topology.replace("slurm", [])  # gone since: the advice goes on the last pass's sizes

    async def scenario() -> dict[str, Any]:
        await rel.cycle()
        doc: dict[str, Any] = await rel.document({"job": "slurm:7"})
        return doc

    advice = run(scenario())["job"]
    assert advice["nodes"] == 3 and advice["partition"] == "batch"
