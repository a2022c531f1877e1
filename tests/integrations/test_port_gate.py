"""The one gate over every port: each verb that changes the cluster is asked right before the call and,
refused, touches nothing and answers as its verb says; reads pass through; every verb of a port's protocol
is in its table (a verb added to the protocol and forgotten in the table fails here, not ungated at a
site)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from watchd.actions.leader_gate import COMMAND_VERBS, NOT_LEADER
from watchd.checks.runner import RUNNER_VERBS, CheckJob, CheckRunner, JobHandle, RunnerError
from watchd.integrations.base import SCHEDULER_VERBS, Scheduler, SchedulerError
from watchd.integrations.fleet import FLEET_VERBS, FleetBackend
from watchd.model.commands import Command
from watchd.port import Verb, VerbTable, gated, table


class Recording:
    """Any port: every verb records its call and answers "done"."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, verb: str) -> Any:
        async def call(*_args: Any, **_kwargs: Any) -> str:
            self.calls.append(verb)
            return "done"

        return call


async def refuse(what: str) -> str:
    return f"{what}: refused"


async def allow(what: str) -> None:
    return None


def coroutines(protocol: type) -> set[str]:
    return {n for n, m in vars(protocol).items() if inspect.iscoroutinefunction(m) and n[0] != "_"}


@pytest.mark.parametrize(
    ("protocol", "verbs"),
    [(Scheduler, SCHEDULER_VERBS), (FleetBackend, FLEET_VERBS), (CheckRunner, RUNNER_VERBS)],
)
def test_every_verb_of_a_protocol_is_in_its_table(protocol: type, verbs: VerbTable) -> None:
    assert coroutines(protocol) == set(verbs)


JOB = CheckJob("gpu-burn", "gpu-1", ("true",), 60.0, "run-1", validation=True)
HANDLE = JobHandle("run-1", "gpu-1", "42")
COMMAND = Command(id="c-1", kind="gpu_reset", node="gpu-1")
CALLS: dict[str, tuple[Any, ...]] = {
    "drain": ({"gpu-1": "xid 79"},),
    "apply_drain": ({"watchd: xid 79": ["gpu-1"]},),
    "requeue_jobs_on": ("gpu-1",),
    "resume": ("gpu-1",),
    "reboot": ("gpu-1", "xid 79"),
    "set_spares": ("gpu", ["gpu-2"]),
    "submit": (JOB,),
    "cancel": (HANDLE,),
    "begin_validation": ("gpu-1", 60.0),
    "end_validation": ("gpu-1", True, "passed"),
    "abandon_validation": ("gpu-1",),
    "lend": ("gpu-1", ["gpu-2"]),
    "run": (COMMAND, 5.0),
}
CHANGES = [
    (verbs, name)
    for verbs in (SCHEDULER_VERBS, FLEET_VERBS, RUNNER_VERBS, COMMAND_VERBS)
    for name, verb in verbs.items()
    if verb.changes
]


@pytest.mark.parametrize(("verbs", "name"), CHANGES, ids=[name for _, name in CHANGES])
async def test_a_refused_change_touches_nothing(verbs: VerbTable, name: str) -> None:
    inner = Recording()
    port = gated(inner, verbs, refuse)
    try:
        answer = await getattr(port, name)(*CALLS[name])
    except (SchedulerError, RunnerError) as exc:
        assert "refused" in str(exc)
    else:
        assert "refused" in repr(answer) and answer != "done"
    assert inner.calls == []
    assert await getattr(gated(inner, verbs, allow), name)(*CALLS[name]) == "done"
    assert inner.calls == [name]


async def test_the_answers_of_refused_changes() -> None:
    scheduler = gated(Recording(), SCHEDULER_VERBS, refuse)
    assert (await scheduler.drain({"gpu-1": "x"}))["gpu-1"].outcome == "failed"
    assert (await scheduler.resume("gpu-1")).outcome == "failed"
    assert (await scheduler.reboot("gpu-1", "x")).outcome == "failed"
    assert not (await scheduler.requeue_jobs_on("gpu-1")).ok
    commands = gated(Recording(), COMMAND_VERBS, refuse)
    assert (await commands.run(COMMAND, 5.0)).outcome == NOT_LEADER


async def test_reads_and_scheduled_checks_pass_through() -> None:
    inner = Recording()
    runner = gated(inner, RUNNER_VERBS, refuse)
    scheduled = CheckJob("gpu-burn", "gpu-1", ("true",), 60.0, "run-2")
    assert await runner.submit(scheduled) == "done"
    assert await runner.availability(["gpu-1"], 60.0) == "done"
    assert runner.name == "recording"
    assert inner.calls == ["submit", "availability"]


def test_a_change_must_say_how_it_is_refused() -> None:
    with pytest.raises(ValueError, match="a change needs"):
        Verb("drain", changes=True)
    with pytest.raises(ValueError, match="twice"):
        table(Verb("pools"), Verb("pools"))
