"""FakeScheduler: the same semantics as SlurmScheduler (see tests/test_slurm_adapter.py), in memory."""

from __future__ import annotations

import pytest

from watchd.integrations.base import Scheduler, SchedulerError
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.nodes import WATCHD_REASON_PREFIX


@pytest.fixture
def fake() -> FakeScheduler:
    f = FakeScheduler()
    f.add_nodes(f"gpu-{i}" for i in range(1, 5))
    f.add_nodes(f"sim-{i}" for i in range(1, 201))
    return f


def test_satisfies_the_protocol(fake: FakeScheduler) -> None:
    sched: Scheduler = fake  # mypy checks the structure
    assert sched.name == "fake"


async def test_node_states_leave_out_unknown(fake: FakeScheduler) -> None:
    states = await fake.node_states(["gpu-1", "nope-1"])
    assert list(states) == ["gpu-1"]
    assert states["gpu-1"].state == "idle" and not states["gpu-1"].drained


async def test_drain_idle_node(fake: FakeScheduler) -> None:
    res = await fake.drain({"gpu-1": "xid 79: GPU has fallen off the bus"})
    assert res["gpu-1"].outcome == "drained"
    st = fake.nodes["gpu-1"]
    assert st.drained and st.reason == f"{WATCHD_REASON_PREFIX} xid 79: GPU has fallen off the bus"


async def test_prefix_not_doubled(fake: FakeScheduler) -> None:
    await fake.drain({"gpu-1": "watchd: xid 48"})
    assert fake.nodes["gpu-1"].reason == "watchd: xid 48"


async def test_drain_twice_is_already_drained(fake: FakeScheduler) -> None:
    await fake.drain({"gpu-2": "xid 48"})
    again = await fake.drain({"gpu-2": "something else"})
    assert again["gpu-2"].outcome == "already_drained"
    assert fake.nodes["gpu-2"].reason == "watchd: xid 48"


@pytest.mark.parametrize("how", ["admin_drain", "down"])
async def test_foreign_drain_or_down_is_skipped_and_kept(fake: FakeScheduler, how: str) -> None:
    if how == "admin_drain":
        fake.set_admin_drain("gpu-3", "maintenance")
    else:
        fake.set_down("gpu-3", "maintenance")
    before = fake.nodes["gpu-3"]
    res = await fake.drain({"gpu-3": "xid 79", "gpu-4": "xid 79"})
    assert res["gpu-3"].outcome == "skipped" and "maintenance" in res["gpu-3"].detail
    assert res["gpu-4"].outcome == "drained"
    assert fake.nodes["gpu-3"] == before


async def test_unknown_node_fails_alone(fake: FakeScheduler) -> None:
    res = await fake.drain({"gpu-1": "xid 79", "nope-1": "xid 79"})
    assert res["nope-1"].outcome == "failed" and res["gpu-1"].outcome == "drained"


async def test_burst_drain_groups_by_reason(fake: FakeScheduler) -> None:
    reasons = {f"sim-{i}": "xid 79" for i in range(1, 151)}
    reasons["sim-3"] = "xid 48"
    res = await fake.drain(reasons)
    assert {r.outcome for r in res.values()} == {"drained"}
    updates = fake.calls_of("update_drain")
    assert sorted((reason, len(nodes)) for reason, nodes in updates) == [
        ("watchd: xid 48", 1),
        ("watchd: xid 79", 149),
    ]
    assert list(res) == list(reasons)  # results in request order


async def test_injected_drain_failure_marks_only_that_node(fake: FakeScheduler) -> None:
    fake.fail_drain.add("gpu-2")
    res = await fake.drain({"gpu-1": "x", "gpu-2": "x"})
    assert res["gpu-1"].outcome == "drained" and res["gpu-2"].outcome == "failed"
    assert not fake.nodes["gpu-2"].drained


async def test_resume_only_watchd_drained(fake: FakeScheduler) -> None:
    await fake.drain({"gpu-1": "xid 79"})
    fake.set_admin_drain("gpu-3", "maintenance")
    assert (await fake.resume("gpu-1")).outcome == "resumed"
    assert not fake.nodes["gpu-1"].drained and fake.nodes["gpu-1"].reason is None
    assert (await fake.resume("gpu-1")).outcome == "not_drained"
    refused = await fake.resume("gpu-3")
    assert refused.outcome == "refused" and "maintenance" in refused.detail
    assert fake.nodes["gpu-3"].drained and fake.nodes["gpu-3"].reason == "maintenance"
    assert (await fake.resume("nope-1")).outcome == "failed"


async def test_requeue_jobs_on(fake: FakeScheduler) -> None:
    fake.add_job("101", ["gpu-1", "gpu-2"], requeue=True)
    fake.add_job("102", ["gpu-1", "gpu-2"], requeue=False)
    fake.add_job("103", ["gpu-3"], requeue=True)
    assert fake.nodes["gpu-1"].state == "allocated"
    await fake.drain({"gpu-1": "xid 79"})
    res = await fake.requeue_jobs_on("gpu-1")
    assert res.requeued == ("101",) and res.not_requeueable == ("102",) and res.ok
    assert fake.jobs["101"].state == "pending" and fake.jobs["101"].restarts == 1
    assert fake.jobs["103"].state == "running"
    again = await fake.requeue_jobs_on("gpu-1")
    assert again.requeued == () and again.not_requeueable == ("102",)


async def test_requeue_failure_is_per_job(fake: FakeScheduler) -> None:
    fake.add_job("201", ["gpu-4"])
    fake.add_job("202", ["gpu-4"])
    fake.fail_requeue.add("202")
    res = await fake.requeue_jobs_on("gpu-4")
    assert res.requeued == ("201",) and "202" in res.failed and not res.ok


async def test_requeue_unknown_node_raises(fake: FakeScheduler) -> None:
    with pytest.raises(SchedulerError, match="nope-1"):
        await fake.requeue_jobs_on("nope-1")


async def test_error_injection_and_call_log(fake: FakeScheduler) -> None:
    await fake.node_states(["gpu-1"])
    fake.error = SchedulerError("scontrol: cannot run 'scontrol': not found")
    with pytest.raises(SchedulerError, match="cannot run"):
        await fake.drain({"gpu-1": "x"})
    assert [name for name, _ in fake.calls] == ["node_states", "drain"]
