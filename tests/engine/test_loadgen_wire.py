"""The load generator of the 100,000-GPU benchmark (benchmarks/loadgen.py) sends what agents send: its
batches are accepted by a real ``watchd engine`` (every event, none invalid), its request head is the real
shipper's, and its summaries are the agent's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.loadgen import NodeEncoder, Plan, agent_summaries, fleet_jobs, node_name, request_head, run
from tests.fault.common import start_engine
from watchd.model.events import batch_from_wire
from watchd.model.gpu import SUMMARY_KIND, GpuSummary

pytestmark = pytest.mark.real


def test_encoded_batches_are_the_agents_summaries() -> None:
    templates = agent_summaries()
    jobs = fleet_jobs(20)
    assert jobs[9] is None and jobs[0] is not None  # a tenth idle
    enc = NodeEncoder(node_name(3), jobs[3], templates[True], 3)
    body = enc.body([1_760_000_005.0, 1_760_000_010.0], 5.0)
    wire = batch_from_wire(json.loads(body), 10_000)
    assert not wire.invalid and len(wire.events) == 16
    first = wire.events[0]
    summary = GpuSummary.read(first)
    assert first.kind == SUMMARY_KIND and first.node == "gpu-00003" and summary is not None
    assert summary.job == jobs[3] and summary.window_start == 1_760_000_000.0
    assert first.time == 1_760_000_005.0
    assert len({e.id for e in wire.events}) == 16  # one id per GPU and window, as the summarizer makes them
    assert len({e.attrs["uuid"] for e in wire.events}) == 8


def test_request_head_is_the_shippers() -> None:
    head, tail = request_head("t0k", "127.0.0.1", 9120)
    text = head.decode()
    assert text.startswith("POST /api/v1/events HTTP/1.1\r\n")
    assert "Authorization: Bearer t0k\r\n" in text and "Content-Type: application/json\r\n" in text
    assert "Host: 127.0.0.1:9120\r\n" in text and text.endswith("Content-Length: ") and tail == b"\r\n\r\n"


def test_a_real_engine_accepts_every_batch(tmp_path: Path) -> None:
    engine = start_engine(tmp_path)
    try:
        # 1 s windows (the agent's default is 5 s): the same batches, sooner
        plan = Plan(
            engine.url, "fault-token", 6, duration_s=2.2, warmup_s=0.2, procs=1, window_s=1.0, sample_s=0.4
        )
        report = run(plan)
    finally:
        engine.stop()
    f = report.figures()
    assert not report.errors, report.errors
    assert f["windows_due"] >= 6 and f["windows_delivered"] == f["windows_due"], f
    assert f["accepted"] == f["events_sent"] > 0 and f["statuses"].keys() == {"200"}, f
    assert report.complete and f["connections_peak"] == 6
