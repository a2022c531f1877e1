"""``GET /api/v1/checks/plan`` asks the scheduler several times per read (the partitions, the nodes' states,
the jobs, the reservations): one read serves every caller for a few seconds, concurrent callers share the
one in flight. Counted on a fake runner with a fake clock, and as Slurm calls on the real test cluster."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.checks.test_service import Harness, nodes
from tests.checks.test_slurm_checks import engine_config
from tests.harness.slurm import SlurmCluster
from watchd.checks.params import ChecksConfig
from watchd.checks.runner import RunOutput
from watchd.checks.subsystem import PLAN_TTL_S, Checks
from watchd.engine.runner import Engine
from watchd.integrations.fake.checks import FakeCheckRunner
from watchd.integrations.slurm.calls import counts


class Counting(FakeCheckRunner):
    def __init__(self) -> None:
        super().__init__(nodes(4), lambda job: RunOutput("completed", "", 0))
        self.members_calls = 0

    async def members(self, partitions: object) -> dict[str, list[str]]:  # type: ignore[override]
        self.members_calls += 1
        await asyncio.sleep(0.01)  # the scheduler takes a while: callers meanwhile share the read
        return await super().members(())


async def test_one_read_serves_concurrent_callers_and_the_next_few_seconds() -> None:
    runner = Counting()
    config = ChecksConfig.model_validate(
        {
            "enabled": True,
            "runner": "fake",
            "items": [
                {"name": "nhc", "type": "command", "command": ["/bin/true"], "partitions": ["gpu"]},
            ],
        }
    )
    h = Harness(config, runner)

    async def validate(node: str, note: str, mode: object) -> dict[str, object]:
        return {}

    checks = Checks(h.service, validate, frozenset())
    plans = await asyncio.gather(*(checks.plans("nhc") for _ in range(10)))
    assert (runner.members_calls, runner.availability_calls) == (1, 1)
    assert all(p == plans[0] for p in plans) and plans[0][0]["check"] == "nhc"
    h.clock.advance(PLAN_TTL_S - 0.5)
    await checks.plans("nhc")
    assert (runner.members_calls, runner.availability_calls) == (1, 1)
    h.clock.advance(1.0)  # stale: read again
    await checks.plans("nhc")
    assert (runner.members_calls, runner.availability_calls) == (2, 2)
    with pytest.raises(KeyError):
        await checks.plans("nope")


@pytest.mark.slurm
async def test_the_plan_route_costs_one_read_of_slurm_for_many_callers(
    slurm_cluster: SlurmCluster, standins: Path, tmp_path: Path
) -> None:
    config = engine_config(slurm_cluster, standins, tmp_path)
    config = config.model_copy(update={"drains": config.drains.model_copy(update={"enabled": False})})
    async with Engine(config) as engine:  # no fleet poll: every Slurm call counted is the plan's
        url = f"http://127.0.0.1:{engine.port}/api/v1/checks/plan?check=nccl"
        headers = {"Authorization": "Bearer t0ken"}
        async with aiohttp.ClientSession(headers=headers) as http:

            async def get() -> int:
                async with http.get(url) as r:
                    await r.read()
                    return r.status

            before = sum(counts().values())
            assert await asyncio.gather(*(get() for _ in range(8))) == [200] * 8
            one_read = sum(counts().values()) - before
            assert 0 < one_read <= 10, one_read  # one read (about 9 calls), not eight
            before = sum(counts().values())
            assert await get() == 200  # within the few seconds: served again, no Slurm call
            assert sum(counts().values()) == before
