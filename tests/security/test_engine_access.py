"""Who may read and who may act (issue 22): viewers read, operators act under the name their token carries,
agents only ingest; /metrics and /healthz open by default and closable; the wire over TLS with real
certificates (mutual TLS as an option), for agents and for the operator's CLI."""

from __future__ import annotations

import asyncio
import contextlib
import io
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.security.certs import Certs
from tests.support import eventually, xid_event
from watchd.agent.metrics import AgentMetrics
from watchd.agent.shipper import Shipper
from watchd.config import AgentConfig, EngineConfig
from watchd.credentials import EngineAuth, NamedToken
from watchd.engine.runner import Engine
from watchd.errors import ConfigError, UsageError
from watchd.http_settings import Listen
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.operator_cli import run_status
from watchd.reach import connect
from watchd.security import engine_client_tls

AGENT, ALICE, VIEWER = "agent-token", "alice-token", "viewer-token"
READS = ("/api/v1/status", "/api/v1/actions", "/api/v1/held")


def auth(**kw: object) -> EngineAuth:
    return EngineAuth(
        token=AGENT,
        operators=[NamedToken(name="alice", token=ALICE)],
        viewers=[NamedToken(name="grafana", token=VIEWER)],
        **kw,  # type: ignore[arg-type]
    )


@contextlib.asynccontextmanager
async def _engine(config: EngineConfig) -> AsyncIterator[Engine]:
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2"])
    await fake.drain({"gpu-1": "Xid 79"})
    async with Engine(config, scheduler=fake) as e:
        yield e


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    async with _engine(EngineConfig(listen=Listen(port=0), auth=auth(), mode="enforce")) as e:
        yield e


async def call(
    url: str, path: str, token: str | None = None, method: str = "GET", **headers: str
) -> tuple[int, dict[str, object]]:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as s, s.request(method, url + path, headers=headers) as r:
        body = await r.json(content_type=None) if r.content_type == "application/json" else {}
        return r.status, body


async def test_reads_need_a_viewers_or_an_operators_token(engine: Engine) -> None:
    url = f"http://127.0.0.1:{engine.port}"
    for path in READS:
        assert (await call(url, path))[0] == 401
        assert (await call(url, path, "wrong"))[0] == 401
        assert (await call(url, path, AGENT))[0] == 403  # the agents' token only ingests
        assert (await call(url, path, VIEWER))[0] == 200
        assert (await call(url, path, ALICE))[0] == 200
    _, body = await call(url, "/api/v1/status")
    assert "pid" not in str(body) and "mode" not in body  # nothing of it without a credential


async def test_metrics_and_health_are_open_by_default(engine: Engine) -> None:
    url = f"http://127.0.0.1:{engine.port}"
    for path in ("/metrics", "/healthz", "/readyz"):
        assert (await call(url, path))[0] == 200


async def test_metrics_and_health_can_be_closed() -> None:
    config = EngineConfig(listen=Listen(port=0), auth=auth(open_metrics=False, open_health=False))
    async with _engine(config) as engine:
        url = f"http://127.0.0.1:{engine.port}"
        for path in ("/metrics", "/healthz"):
            assert (await call(url, path))[0] == 401
            assert (await call(url, path, VIEWER))[0] == 200


async def test_a_viewer_cannot_act_and_an_operator_acts_under_the_tokens_name(engine: Engine) -> None:
    url = f"http://127.0.0.1:{engine.port}"
    resume = "/api/v1/nodes/gpu-1/resume"
    assert (await call(url, resume, VIEWER, "POST"))[0] == 403
    assert (await call(url, resume, AGENT, "POST"))[0] == 403
    status, body = await call(url, resume, ALICE, "POST", **{"X-Watchd-Operator": "mallory"})
    assert status == 200 and body["outcome"] == "resumed", body
    [entry] = [a for a in engine.recent_actions(10) if a["action"] == "resume"]
    assert "by alice" in entry["detail"] and "mallory" not in entry["detail"]


async def test_agents_ingest_with_their_token_only(engine: Engine) -> None:
    url = f"http://127.0.0.1:{engine.port}"
    metrics = AgentMetrics()
    for token, delivered in ((VIEWER, False), (ALICE, False), (AGENT, True)):
        shipper = Shipper("gpu-2", url, token, metrics, backoff_initial=0.05, backoff_max=0.1)
        shipper.offer(xid_event("gpu-2", 13, event_id=f"e-{token}"))
        task = asyncio.create_task(shipper.run())
        try:
            assert await shipper.wait_idle(1.0) is delivered
        finally:
            task.cancel()
    assert engine.metrics.ingest_rejected.labels("unauthorized")._value.get() >= 2


def test_shared_and_role_tokens_must_differ_and_names_be_unique() -> None:
    from watchd.security import engine_credentials

    with pytest.raises(ConfigError, match="agents' token"):
        engine_credentials(EngineAuth(token=ALICE, operators=[NamedToken(name="alice", token=ALICE)]))
    with pytest.raises(ValueError, match="given twice"):
        EngineAuth(operators=[NamedToken(name="a", token="x"), NamedToken(name="a", token="y")])


def test_only_the_agents_token_ingests_whatever_else_is_configured() -> None:
    """Was: with no agents' token, a viewer's (or an operator's) token ingested, and so drained. The config
    is refused at start (test_role_matrix.py); credentials built without it still let no other role in."""
    from watchd.httputil import Credentials, Principal
    from watchd.security import engine_credentials

    credentials = Credentials(operators={ALICE: "alice"}, viewers={VIEWER: "grafana"})
    for token, role in ((ALICE, "operator"), (VIEWER, "viewer")):
        principal = credentials.identify(f"Bearer {token}")
        assert principal == Principal(principal.name, role, bound=True)  # type: ignore[union-attr]
        assert not credentials.allows(principal, "ingest")
        assert credentials.allows(principal, "agent_read")
    with pytest.raises(ConfigError, match="agents' token"):
        engine_credentials(EngineAuth(viewers=[NamedToken(name="grafana", token=VIEWER)]))


def test_engine_url_must_be_http_or_https() -> None:
    with pytest.raises(ValueError, match=r"engine\.url"):
        AgentConfig.model_validate({"engine": {"url": "ftp://x"}})
    with pytest.raises(ValueError, match="https"):
        AgentConfig.model_validate({"engine": {"url": "http://x:1", "ca_file": "/etc/ca.pem"}})
    AgentConfig.model_validate({"engine": {"url": "https://engine:9120"}})


# ------------------------------------------------------------------------------------------------- TLS


def tls_config(certs: Certs, *, mutual: bool) -> EngineConfig:
    listen = Listen(
        port=0,
        tls_cert=certs.server_cert,
        tls_key=certs.server_key,
        client_ca=certs.ca if mutual else None,
    )
    return EngineConfig(listen=listen, auth=auth(), mode="enforce")


def client_context(certs: Certs, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if cert is not None and key is not None:
        context.load_cert_chain(cert, key)
    return context


async def test_agent_to_engine_over_mutual_tls(certs: Certs) -> None:
    async with _engine(tls_config(certs, mutual=True)) as engine:
        url = f"https://127.0.0.1:{engine.port}"
        agent = AgentConfig.model_validate(
            {
                "engine": {
                    "url": url,
                    "ca_file": str(certs.ca),
                    "client_cert": str(certs.client_cert),
                    "client_key": str(certs.client_key),
                }
            }
        )
        e = agent.engine
        shipper = Shipper(
            "gpu-2",
            url,
            AGENT,
            AgentMetrics(),
            tls=engine_client_tls(e.url, e.ca_file, e.client_cert, e.client_key),
        )
        shipper.offer(xid_event("gpu-2", 13, event_id="tls-1"))
        task = asyncio.create_task(shipper.run())
        try:
            assert await shipper.wait_idle(5.0)
        finally:
            task.cancel()
        await eventually(lambda: engine.metrics.events_received.labels("kmsg", "xid")._value.get() == 1)
        # no client certificate, or one from a CA the engine does not trust: the handshake fails
        for context in (client_context(certs), client_context(certs, certs.rogue_cert, certs.rogue_key)):
            with pytest.raises(aiohttp.ClientError):
                async with aiohttp.ClientSession() as s, s.get(f"{url}/healthz", ssl=context) as r:
                    await r.read()
        # plain HTTP to the TLS port gets nothing
        with pytest.raises(aiohttp.ClientError):
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{engine.port}/healthz") as r:
                await r.read()


async def test_operator_cli_reads_status_over_tls(certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    async with _engine(tls_config(certs, mutual=False)) as engine:
        url = f"https://127.0.0.1:{engine.port}"
        monkeypatch.setenv("WATCHD_TOKEN", VIEWER)
        monkeypatch.delenv("WATCHD_CA_FILE", raising=False)
        with pytest.raises(UsageError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            await asyncio.to_thread(
                run_status, connect(url), True, io.StringIO()
            )  # the system's CAs: unknown
        monkeypatch.setenv("WATCHD_CA_FILE", str(certs.ca))
        out = io.StringIO()
        assert await asyncio.to_thread(run_status, connect(url), True, out) == 0
        assert '"mode": "enforce"' in out.getvalue()
        with pytest.raises(UsageError, match="http:// or https://"):
            connect("ftp://x")


def test_a_listener_with_a_missing_key_is_a_config_error(certs: Certs, tmp_path: Path) -> None:
    from watchd.security import listener_tls

    with pytest.raises(ValueError, match="together"):
        Listen(port=0, tls_cert=certs.server_cert)
    with pytest.raises(ConfigError, match="cannot load"):
        listener_tls(Listen(port=0, tls_cert=certs.server_cert, tls_key=tmp_path / "none.pem"), "listen")
