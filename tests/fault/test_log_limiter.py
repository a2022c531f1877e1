"""The repeated-log-line limiter (issue 16 item 12), in process: watchd.logs is this suite's own module."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import structlog

from watchd.logs import RepeatLimiter, configure_logging, get_logger


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Sink:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def msg(self, line: str) -> None:
        self.lines.append(line)


def _render(_: Any, __: str, event: Any) -> str:
    return json.dumps(dict(event))


def _run(limiter: RepeatLimiter, sink: Sink, event: str, n: int, method: str = "info") -> int:
    passed = 0
    for i in range(n):
        try:
            limiter(sink, method, {"event": event, "i": i})
            passed += 1
        except structlog.DropEvent:
            pass
    return passed


def test_first_n_pass_then_one_summary_with_the_count() -> None:
    clock, sink = Clock(), Sink()
    limiter = RepeatLimiter(_render, limit=5, interval_s=10, clock=clock)
    assert _run(limiter, sink, "action", 100) == 5
    assert sink.lines == []  # the summary comes when the interval ends
    clock.t += 10
    assert _run(limiter, sink, "other", 1) == 1
    [summary] = [json.loads(s) for s in sink.lines]
    assert summary["event"] == "log_lines_suppressed"
    assert summary["suppressed_event"] == "action" and summary["suppressed"] == 95
    assert _run(limiter, sink, "action", 7) == 5  # a new interval lets the first 5 through again


def test_keys_are_independent_and_errors_never_suppressed() -> None:
    clock, sink = Clock(), Sink()
    limiter = RepeatLimiter(_render, limit=2, interval_s=10, clock=clock)
    assert _run(limiter, sink, "a", 10) == 2
    assert _run(limiter, sink, "b", 10) == 2
    assert _run(limiter, sink, "a", 10, method="error") == 10


def test_an_error_that_says_it_repeats_is_limited_like_any_line() -> None:
    clock, sink = Clock(), Sink()
    limiter = RepeatLimiter(_render, limit=2, interval_s=10, clock=clock)
    passed = []
    for i in range(10):
        with contextlib.suppress(structlog.DropEvent):
            passed.append(limiter(sink, "error", {"event": "audit_failed", "i": i, "rate_limited": True}))
    assert [p["i"] for p in passed] == [0, 1] and all("rate_limited" not in p for p in passed)
    clock.t += 10
    assert _run(limiter, sink, "other", 1) == 1
    [summary] = [json.loads(s) for s in sink.lines]
    assert (summary["suppressed_event"], summary["suppressed"]) == ("audit_failed", 8)
    assert _run(limiter, sink, "audit_failed", 5, method="error") == 5  # without it: never suppressed


def test_flush_reports_pending_counts_once() -> None:
    clock, sink = Clock(), Sink()
    limiter = RepeatLimiter(_render, limit=1, interval_s=60, clock=clock)
    _run(limiter, sink, "event_time_in_future", 4)
    _run(limiter, sink, "quiet", 1)
    limiter.flush()
    limiter.flush()
    summaries = [json.loads(s) for s in sink.lines]
    assert [(s["suppressed_event"], s["suppressed"]) for s in summaries] == [("event_time_in_future", 3)]


def test_wired_in_configure_logging() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    try:
        log = get_logger("watchd.test")
        for i in range(100):
            log.info("flood", i=i)
        import watchd.logs as logs

        assert logs._active is not None
        logs._active.flush()
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        floods = [ln for ln in lines if ln["event"] == "flood"]
        [summary] = [ln for ln in lines if ln["event"] == "log_lines_suppressed"]
        assert len(floods) == logs.REPEAT_LIMIT
        assert summary["suppressed"] == 100 - logs.REPEAT_LIMIT and "timestamp" in summary
    finally:
        structlog.reset_defaults()
