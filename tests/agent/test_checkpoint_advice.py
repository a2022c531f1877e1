"""Checkpoint advice through the local agent: a rank asks over the heartbeat socket, the agent checks it runs
in the job it names (as for a heartbeat) and asks the engine with its own token, which may read that one
job's advice and nothing else of the fleet; every failure reaches the caller with its reason."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.daemons import free_port
from watchd.agent.advice import EngineAdvice
from watchd.agent.heartbeat_auth import FakeJobIdentity, ProcessIdentity
from watchd.agent.heartbeat_server import HeartbeatServer
from watchd.agent.metrics import AgentMetrics
from watchd.agent.settings import HeartbeatConfig
from watchd.client import AdviceUnavailable, advised_checkpoint_interval, checkpoint_advice
from watchd.clock import SystemClock
from watchd.httputil import Credentials, auth_middleware, json_response, serve
from watchd.model.jobs import JobRef
from watchd.model.reliability import JOB_ADVICE_PATH

ADVICE = {"job": "slurm:7", "advised_interval_s": 1234.5, "young_interval_s": 1300.0}


class Answers:
    """Stands for the engine: what it answers, and which jobs it was asked about."""

    def __init__(self, status: int = 200, doc: dict[str, Any] | None = None) -> None:
        self.status, self.doc = status, doc if doc is not None else {"job": ADVICE}
        self.asked: list[str] = []

    async def __call__(self, job: str) -> tuple[int, dict[str, Any]]:
        self.asked.append(job)
        return self.status, self.doc


async def agent(sock: Path, answers: Answers | None) -> HeartbeatServer:
    """An agent whose socket peer (this test process) runs in Slurm job 7."""
    identity = FakeJobIdentity({os.getpid(): ProcessIdentity(JobRef("slurm", "7"))})
    config = HeartbeatConfig(socket=sock, http_port=0)
    server = HeartbeatServer(
        config, "gpu-1", SystemClock(), AgentMetrics(), lambda e: None, identity=identity, advice=answers
    )
    await server.start()
    return server


def ask(sock: Path, job: str | None = "slurm:7") -> Any:
    return asyncio.to_thread(advised_checkpoint_interval, job, socket_path=str(sock), timeout=5)


async def reason_of(sock: Path, job: str | None = "slurm:7") -> AdviceUnavailable:
    with pytest.raises(AdviceUnavailable) as exc:
        await ask(sock, job)
    return exc.value


async def test_a_rank_gets_its_jobs_advice_from_the_local_agent(tmp_path: Path) -> None:
    sock = tmp_path / "hb.sock"
    answers = Answers()
    server = await agent(sock, answers)
    try:
        assert await ask(sock) == 1234.5
        assert await ask(sock, "7") == 1234.5  # SLURM_JOB_ID as the job's environment has it
        assert answers.asked == ["slurm:7", "7"]
        full = await asyncio.to_thread(checkpoint_advice, "slurm:7", socket_path=str(sock))
        assert full == ADVICE
    finally:
        await server.stop()


async def test_a_caller_outside_the_job_is_refused_and_the_engine_never_asked(tmp_path: Path) -> None:
    sock = tmp_path / "hb.sock"
    answers = Answers()
    server = await agent(sock, answers)
    try:
        refused = await reason_of(sock, "slurm:8")
        assert refused.reason == "refused" and "wrong_job" in refused.detail
        assert answers.asked == []
        assert server._metrics.heartbeats_rejected.labels("wrong_job")._value.get() == 1
    finally:
        await server.stop()


@pytest.mark.parametrize(
    ("status", "doc", "reason", "detail"),
    [
        (404, {"error": "job slurm:7: no heartbeats from it"}, "unknown_job", "no heartbeats"),
        (200, {"job": {"job": "slurm:7", "advice": None, "why": "no MTBF"}}, "no_advice", "no MTBF"),
        (
            502,
            {"error": "the engine cannot be reached: ClientConnectorError"},
            "engine_unreachable",
            "reached",
        ),
        (200, {"unexpected": 1}, "bad_answer", "answered 200"),
    ],
)
async def test_every_failure_reaches_the_caller_with_its_reason(
    status: int, doc: dict[str, Any], reason: str, detail: str, tmp_path: Path
) -> None:
    sock = tmp_path / "hb.sock"
    server = await agent(sock, Answers(status, doc))
    try:
        got = await reason_of(sock)
        assert got.reason == reason and detail in got.detail
    finally:
        await server.stop()


async def test_no_agent_and_no_job_are_reasons_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHD_HEARTBEAT_PORT", str(free_port()))  # nothing listens there either
    got = await reason_of(tmp_path / "absent.sock")
    assert got.reason == "no_agent" and "127.0.0.1:" in got.detail
    for var in ("WATCHD_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    assert (await reason_of(tmp_path / "absent.sock", None)).reason == "no_job"


async def test_an_agent_without_an_engine_answers_503(tmp_path: Path) -> None:
    sock = tmp_path / "hb.sock"
    server = await agent(sock, None)
    try:
        assert (await reason_of(sock)).reason == "engine_unreachable"
    finally:
        await server.stop()


# ----------------------------------------------------------------- the engine's side, and the agent's ask


def engine_app(credentials: Credentials) -> web.Application:
    """The engine's auth middleware as the engine sets it up, over stand-in reliability routes."""

    async def one_job(request: web.Request) -> web.Response:
        if request.query["job"] == "slurm:7":
            return json_response({"job": ADVICE})
        return json_response({"error": f"job {request.query['job']}: no heartbeats from it"}, status=404)

    async def fleet(request: web.Request) -> web.Response:
        return json_response({"jobs": [ADVICE]})

    app = web.Application(
        middlewares=[auth_middleware(credentials, "/api/v1/ingest", agent_reads=(JOB_ADVICE_PATH,))]
    )
    app.router.add_get(JOB_ADVICE_PATH, one_job)
    app.router.add_get("/api/v1/reliability", fleet)
    return app


async def test_the_agents_token_reads_one_jobs_advice_and_not_the_fleet() -> None:
    credentials = Credentials(shared="agent-token", viewers={"viewer-token": "grafana"})
    async with serve(engine_app(credentials), "127.0.0.1", 0) as port:
        url = f"http://127.0.0.1:{port}"
        ask_engine = EngineAdvice(url, "agent-token", 5.0)
        try:
            assert await ask_engine("slurm:7") == (200, {"job": ADVICE})
            status, doc = await ask_engine("slurm:9")
            assert status == 404 and "no heartbeats" in doc["error"]
            status, doc = await EngineAdvice(url, "wrong", 5.0)("slurm:7")
            assert status == 502 and "refused the agent's token (401)" in doc["error"]
        finally:
            await ask_engine.close()
        # the whole fleet's report stays a viewer's (or an operator's) read
        assert (await _get(f"{url}/api/v1/reliability", "agent-token"))[0] == 403
        assert (await _get(f"{url}/api/v1/reliability", "viewer-token"))[0] == 200
        assert (await _get(f"{url}{JOB_ADVICE_PATH}?job=slurm:7", "viewer-token"))[0] == 200


async def test_an_engine_that_is_away_is_a_502_with_the_reason() -> None:
    ask_engine = EngineAdvice(f"http://127.0.0.1:{free_port()}", "agent-token", 2.0)
    try:
        status, doc = await ask_engine("slurm:7")
    finally:
        await ask_engine.close()
    assert status == 502 and doc["error"].startswith("the engine cannot be reached")


async def _get(url: str, token: str) -> tuple[int, Any]:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"Authorization": f"Bearer {token}"}) as resp,
    ):
        return resp.status, await resp.json()
