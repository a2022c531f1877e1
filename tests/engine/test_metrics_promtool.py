"""Both daemons' /metrics pass `promtool check metrics` (the linter Prometheus users run)."""

from __future__ import annotations

import subprocess

import aiohttp
import pytest

from tests.agent.test_agent import agent_config, engine_config
from tests.support import XID79, eventually, scheduler_actions
from watchd.agent.runner import Agent
from watchd.engine.runner import Engine
from watchd.sources.base import FakeLogSource

pytestmark = pytest.mark.real


async def fetch(port: int) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        return await r.text()


def check(promtool: str, text: str) -> None:
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, f"promtool check metrics:\n{res.stdout}{res.stderr}"


async def test_engine_and_agent_metrics_pass_promtool(promtool: str) -> None:
    async with Engine(engine_config(0), use_config_scheduler=False) as engine:
        source = FakeLogSource("kmsg")
        async with Agent(agent_config(engine.port), sources=[source]) as agent:
            source.inject_log(XID79)
            await eventually(lambda: len(scheduler_actions(engine.audit.entries)) == 2, what="decisions")
            engine_text, agent_text = await fetch(engine.port), await fetch(agent.port)
    assert "watchd_decision_latency_seconds_bucket" in engine_text
    assert "watchd_agent_events_shipped_total 1.0" in agent_text
    for daemon, text in (("engine", engine_text), ("agent", agent_text)):
        assert "\nprocess_resident_memory_bytes " in text and "\nprocess_cpu_seconds_total " in text
        assert f'watchd_build_info{{daemon="{daemon}",' in text
        assert "_created" not in text  # prometheus_client's *_created series are switched off
    check(promtool, engine_text)
    check(promtool, agent_text)


def test_promtool_rejects_bad_metrics(promtool: str) -> None:
    """The check above can fail: promtool does flag a badly named counter."""
    bad = "# HELP requests Requests.\n# TYPE requests counter\nrequests 1\n"
    res = subprocess.run(
        [promtool, "check", "metrics"], input=bad, capture_output=True, text=True, check=False
    )
    assert res.returncode != 0


def test_every_scheduler_action_has_its_latency_series_from_the_start() -> None:
    """An action timed in the scheduler (``runtime.scheduled``) whose histogram series appeared only at its
    first observation would have no rate() in Prometheus until its second: each is created at 0."""
    import re
    from pathlib import Path

    from watchd.actions.handlers import HANDLERS
    from watchd.engine.metrics import SCHEDULER_ACTIONS, EngineMetrics

    handlers = Path(__file__).resolve().parents[2] / "watchd" / "actions" / "handlers"
    timed = {
        kind
        for kind, handler in HANDLERS.items()
        if re.search(
            r"runtime\.scheduled\(",
            (handlers / f"{type(handler).__module__.rsplit('.', 1)[1]}.py").read_text(),
        )
    }
    assert timed == set(SCHEDULER_ACTIONS)
    registry = EngineMetrics().registry
    for action in SCHEDULER_ACTIONS:
        assert registry.get_sample_value("watchd_action_duration_seconds_count", {"action": action}) == 0.0
