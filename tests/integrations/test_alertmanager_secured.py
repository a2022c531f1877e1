"""The Alertmanager client behind authentication and TLS, against a real Alertmanager: basic auth, TLS with a
private CA and a client certificate through Alertmanager's own ``--web.config.file``; a bearer token through a
small TLS reverse proxy (aiohttp on loopback, a certificate made with ``openssl``), since Alertmanager itself
checks no bearer token. Every alert carries the external labels (``cluster``). The ``alertmanager:`` keys
load strictly."""

from __future__ import annotations

import ssl
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from tests.harness.alertmanager import AlertmanagerProcess, available
from tests.security.certs import Certs, make_certs
from watchd.config import EngineConfig, load_config
from watchd.errors import ConfigError
from watchd.httputil import serve, server_tls
from watchd.integrations.alertmanager.notifier import notifier_from_settings
from watchd.integrations.alertmanager.settings import AlertmanagerConfig
from watchd.integrations.alerts import Alert

pytestmark = pytest.mark.real

PASSWORD = "s3cret-am"
TOKEN = "am-bearer-token"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("am-certs"))


def bcrypt(password: str) -> str:
    """A bcrypt hash for Alertmanager's basic_auth_users: the stdlib's crypt (libxcrypt's $2b$)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 4))


def harness_tls(certs: Certs, client_cert: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if client_cert:
        ctx.load_cert_chain(certs.client_cert, certs.client_key)
    return ctx


def basic(password: str = PASSWORD) -> str:
    import base64

    return "Basic " + base64.b64encode(f"watchd:{password}".encode()).decode()


@pytest.fixture(scope="module")
def secured_am(certs: Certs) -> Iterator[AlertmanagerProcess]:
    """A real Alertmanager that speaks only TLS, wants a client certificate from the CA, and basic auth."""
    ok, why = available()
    if not ok:
        pytest.skip(why)
    web_config = (
        "tls_server_config:\n"
        f"  cert_file: {certs.server_cert}\n"
        f"  key_file: {certs.server_key}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {certs.ca}\n"
        "basic_auth_users:\n"
        f"  watchd: '{bcrypt(PASSWORD)}'\n"
    )
    with AlertmanagerProcess(web_config=web_config, client=(harness_tls(certs), basic())) as am:
        yield am


def alert(name: str, **labels: str) -> Alert:
    return Alert(
        labels={"alertname": name, "node": "gpu-1", "severity": "warning", **labels},
        annotations={"summary": "GPU fell off the bus"},
        generator_url="http://watchd.example:9120/api/v1/actions",
    )


def secret(tmp_path: Path, name: str, value: str) -> Path:
    path = tmp_path / name
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


async def fire_one(config: AlertmanagerConfig, name: str, **labels: str) -> tuple[str, CollectorRegistry]:
    """Fire one alert through the engine's notifier built from ``config``; the send's outcome."""
    registry = CollectorRegistry()
    async with notifier_from_settings(config, registry=registry) as notifier:
        await notifier.fire(name, alert(name, **labels))
        (receiver,) = notifier.receivers()
        return receiver["last_outcome"], registry


async def test_basic_auth_tls_and_a_client_certificate_reach_a_real_alertmanager(
    secured_am: AlertmanagerProcess, certs: Certs, tmp_path: Path
) -> None:
    name = f"WatchdSecured{uuid.uuid4().hex[:8]}"
    config = AlertmanagerConfig(
        urls=[secured_am.url],
        basic_auth={"username": "watchd", "password_file": secret(tmp_path, "am-password", PASSWORD)},  # type: ignore[arg-type]
        ca_file=certs.ca,
        client_cert=certs.client_cert,
        client_key=certs.client_key,
        external_labels={"cluster": "gpu-west", "region": "eu"},
    )
    outcome, _ = await fire_one(config, name)
    assert outcome == "delivered"
    got = secured_am.alert(name)
    assert got is not None
    assert got["labels"] == {
        "alertname": name,
        "node": "gpu-1",
        "severity": "warning",
        "cluster": "gpu-west",
        "region": "eu",
    }
    # an alert's own label wins over an external one of the same name (as in Prometheus)
    own = f"WatchdSecured{uuid.uuid4().hex[:8]}"
    assert (await fire_one(config, own, cluster="from-the-rule"))[0] == "delivered"
    got = secured_am.alert(own)
    assert got is not None and got["labels"]["cluster"] == "from-the-rule"


@pytest.mark.parametrize(
    ("change", "outcome"),
    [
        ({"basic_auth": {"username": "watchd", "password": "wrong"}}, "rejected"),  # 401: not retried
        ({"basic_auth": None}, "rejected"),
        ({"client_cert": None, "client_key": None}, "failed"),  # the TLS handshake is refused
        ({"ca_file": None}, "failed"),  # the server's certificate is not trusted
    ],
    ids=["wrong-password", "no-credentials", "no-client-certificate", "untrusted-server"],
)
async def test_what_the_alertmanager_refuses_is_not_stored(
    secured_am: AlertmanagerProcess, certs: Certs, change: dict[str, object], outcome: str
) -> None:
    name = f"WatchdRefused{uuid.uuid4().hex[:8]}"
    base: dict[str, object] = {
        "urls": [secured_am.url],
        "basic_auth": {"username": "watchd", "password": PASSWORD},
        "ca_file": certs.ca,
        "client_cert": certs.client_cert,
        "client_key": certs.client_key,
        "timeout_s": 2,
    }
    config = AlertmanagerConfig.model_validate({**base, **change})
    got, registry = await fire_one(config, name)
    assert got == outcome
    assert registry.get_sample_value("watchd_alertmanager_up", {"receiver": secured_am.url}) == (
        1.0 if outcome == "rejected" else 0.0  # a 4xx is a bug in what was sent, not the receiver down
    )
    assert secured_am.alert(name) is None


@asynccontextmanager
async def bearer_proxy(target: str, certs: Certs) -> AsyncIterator[str]:
    """An HTTPS reverse proxy on loopback that lets through only ``Authorization: Bearer TOKEN``."""
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.Response(status=401, text="bad token")
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with session.request(request.method, target + request.path_qs, data=body, headers=headers) as r:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    try:
        async with serve(app, "127.0.0.1", 0, None, server_tls(certs.server_cert, certs.server_key)) as port:
            yield f"https://127.0.0.1:{port}"
    finally:
        await session.close()


async def test_a_bearer_token_through_a_tls_proxy(certs: Certs, tmp_path: Path) -> None:
    ok, why = available()
    if not ok:
        pytest.skip(why)
    with AlertmanagerProcess() as am:
        async with bearer_proxy(am.url, certs) as url:
            config = AlertmanagerConfig(
                urls=[url],
                bearer_token={"token_file": secret(tmp_path, "am-token", TOKEN)},  # type: ignore[arg-type]
                ca_file=certs.ca,
                external_labels={"cluster": "gpu-east"},
            )
            name = f"WatchdBearer{uuid.uuid4().hex[:8]}"
            assert (await fire_one(config, name))[0] == "delivered"
            got = am.alert(name)
            assert got is not None and got["labels"]["cluster"] == "gpu-east"
            wrong = AlertmanagerConfig.model_validate(
                {"urls": [url], "bearer_token": {"token": "nope"}, "ca_file": certs.ca}
            )
            refused = f"WatchdBearer{uuid.uuid4().hex[:8]}"
            assert (await fire_one(wrong, refused))[0] == "rejected"
            assert am.alert(refused) is None


@pytest.mark.parametrize(
    ("yaml_text", "error"),
    [
        ("alertmanager: {basic_auth: {username: w, passwrd: x}}", r"alertmanager\.basic_auth\.passwrd"),
        ("alertmanager: {basic_auth: {username: w}}", "exactly one of password_file"),
        (
            "alertmanager: {urls: ['https://a'], basic_auth: {username: w, password: x}, "
            "bearer_token: {token: t}}",
            "basic_auth or bearer_token, not both",
        ),
        ("alertmanager: {urls: ['https://a'], bearer_token: {}}", "give one of token_file"),
        ("alertmanager: {urls: ['https://a'], client_cert: /c.pem}", "client_cert and client_key together"),
        ("alertmanager: {urls: ['http://a'], ca_file: /ca.pem}", "need https:// urls"),
        ("alertmanager: {external_labels: {'bad-name': x}}", r"alertmanager\.external_labels"),
        ("alertmanager: {external_labels: {cluster: ''}}", r"alertmanager\.external_labels\.cluster"),
        ("alertmanager: {tls: {ca_file: /ca.pem}}", r"alertmanager\.tls"),
    ],
)
def test_the_keys_load_strictly(tmp_path: Path, yaml_text: str, error: str) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text(yaml_text + "\n")
    with pytest.raises(ConfigError, match=error):
        load_config(EngineConfig, path)


def test_a_secret_that_cannot_be_read_names_its_key(tmp_path: Path) -> None:
    missing = AlertmanagerConfig(
        urls=["https://am:9093"],
        basic_auth={"username": "w", "password_file": tmp_path / "none"},  # type: ignore[arg-type]
    )
    with pytest.raises(ConfigError, match=r"alertmanager\.basic_auth\.password_file"):
        notifier_from_settings(missing, registry=CollectorRegistry())
    bad_ca = tmp_path / "ca.pem"
    bad_ca.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"alertmanager\.ca_file"):
        notifier_from_settings(
            AlertmanagerConfig(urls=["https://am:9093"], ca_file=bad_ca), registry=CollectorRegistry()
        )
