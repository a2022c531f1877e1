"""``watchd node resume`` through the running engine: POST /api/v1/nodes/{node}/resume, token-protected,
executed by the action executor as an operator's resume (audited, whatever the engine's mode), and still
refusing a node watchd did not drain."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.daemons import free_port
from watchd.config import EngineConfig
from watchd.credentials import TokenSource
from watchd.engine.runner import Engine
from watchd.errors import UsageError
from watchd.http_settings import Listen
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.nodes import WATCHD_REASON_PREFIX
from watchd.operator_cli import run_resume
from watchd.reach import Settings, connect, resolve

TOKEN = "t0ken"


@pytest.fixture(params=["enforce", "dry-run"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[Engine]:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2", "gpu-3"])
    await fake.drain({"gpu-1": "Xid 79"})  # watchd's drain
    fake.set_admin_drain("gpu-2", "bad DIMM")  # an admin's
    fake.calls.clear()
    config = EngineConfig(listen=Listen(port=0), auth=TokenSource(token=TOKEN), mode=request.param)
    async with Engine(config, scheduler=fake) as e:
        yield e


def fake_of(engine: Engine) -> FakeScheduler:
    assert isinstance(engine.scheduler, FakeScheduler)
    return engine.scheduler


async def post(
    engine: Engine, node: str, token: str | None = TOKEN, by: str = "alice"
) -> tuple[int, dict[str, str]]:
    headers = {"X-Watchd-Operator": by}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    url = f"http://127.0.0.1:{engine.port}/api/v1/nodes/{node}/resume"
    async with aiohttp.ClientSession() as s, s.post(url, headers=headers) as r:
        return r.status, await r.json()


def resumes(engine: Engine) -> list[tuple[str, str, str, str, str]]:
    return [
        (a["node"], a["rule"], a["mode"], a["outcome"], a["detail"])
        for a in engine.recent_actions(100)
        if a["action"] == "resume"
    ]


async def test_resumes_watchds_drain_audited(engine: Engine) -> None:
    status, body = await post(engine, "gpu-1")
    assert status == 200 and body["outcome"] == "resumed", body
    assert not fake_of(engine).nodes["gpu-1"].drained  # an operator decided: done in dry-run mode too
    assert resumes(engine) == [
        ("gpu-1", "operator", "enforce", "resumed", f"by alice: {WATCHD_REASON_PREFIX} Xid 79")
    ]
    assert [e.action for e in engine.audit.entries] == ["resume"]
    # again: the node is in service (not de-duplicated: the scheduler says so)
    status, body = await post(engine, "gpu-1", by="bob")
    assert status == 200 and body == {"outcome": "not_drained", "detail": "IDLE"}
    assert fake_of(engine).calls_of("resume") == ["gpu-1", "gpu-1"]


async def test_refuses_an_admins_drain(engine: Engine) -> None:
    status, body = await post(engine, "gpu-2")
    assert status == 409 and body["outcome"] == "refused" and "bad DIMM" in body["detail"]
    assert fake_of(engine).nodes["gpu-2"].reason == "bad DIMM"
    assert resumes(engine)[0][:4] == ("gpu-2", "operator", "enforce", "refused")


async def test_a_resume_after_watchd_drained_again_is_not_swallowed_by_a_cooldown(engine: Engine) -> None:
    assert (await post(engine, "gpu-1"))[1]["outcome"] == "resumed"
    await fake_of(engine).drain({"gpu-1": "Xid 48"})
    assert (await post(engine, "gpu-1"))[1]["outcome"] == "resumed"


async def test_needs_the_token(engine: Engine) -> None:
    for token in (None, "wrong"):
        status, body = await post(engine, "gpu-1", token=token)
        assert status == 401 and "token" in body["error"]
    assert fake_of(engine).calls_of("resume") == [] and resumes(engine) == []


async def test_an_unknown_node_fails(engine: Engine) -> None:
    status, body = await post(engine, "gpu-9")
    assert status == 502 and body == {"outcome": "failed", "detail": "unknown node"}


async def test_without_a_scheduler() -> None:
    config = EngineConfig(listen=Listen(port=0), auth=TokenSource(token=TOKEN))
    async with Engine(config, use_config_scheduler=False) as engine:
        status, body = await post(engine, "gpu-1")
    assert status == 503 and body["outcome"] == "no_scheduler"


# ------------------------------------------------------------------------------------------ the command


async def test_the_command_through_the_engine(engine: Engine, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    url = f"http://127.0.0.1:{engine.port}"
    out = io.StringIO()
    client = connect(url, token_file, by="carol")
    code = await asyncio.to_thread(run_resume, "gpu-2", client, False, out)
    assert code == 4 and out.getvalue() == "gpu-2: refused (drained by someone else: 'bad DIMM')\n"
    out = io.StringIO()
    # the engine's address and token from its config file, as `--config /etc/watchd/engine.yaml` gives them
    config = tmp_path / "engine.yaml"
    config.write_text(
        yaml.safe_dump({"listen": {"host": "0.0.0.0", "port": engine.port}, "auth": {"token": TOKEN}})
    )
    target = resolve(Settings(config=config), env={})
    assert (target.url, target.token) == (url, TOKEN)
    code = await asyncio.to_thread(run_resume, "gpu-1", connect(config=config, by="carol"), False, out)
    assert code == 0 and out.getvalue().startswith("gpu-1: resumed (")
    assert [r[3] for r in resumes(engine)] == ["refused", "resumed"]
    with pytest.raises(UsageError, match="HTTP 401") as refused:
        await asyncio.to_thread(run_resume, "gpu-1", connect(url, by="carol"), False, io.StringIO())
    assert refused.value.exit_code == 4


def test_a_clear_error_when_the_engine_is_not_running() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UsageError, match=rf"cannot reach the engine at {url}: .*is `watchd engine` running"):
        run_resume("gpu-1", connect(url), False, io.StringIO())
