"""The operator commands over TLS, reached as docs/cli.md says: the engine's CA and a client certificate from
the flags or the environment, ``--insecure`` for a test bench, and ``--config`` naming an https:// engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from tests.security.certs import Certs
from tests.security.test_engine_access import VIEWER, _engine, tls_config
from watchd.cli import main
from watchd.reach import Settings, resolve

ENV = ("WATCHD_URL", "WATCHD_TOKEN", "WATCHD_TOKEN_FILE", "WATCHD_CA_FILE", "WATCHD_CLIENT_CERT")


def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*ENV, "WATCHD_CLIENT_KEY", "WATCHD_TLS_INSECURE"):
        monkeypatch.delenv(name, raising=False)


async def watchd(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_mutual_tls_from_the_flags_and_from_the_environment(
    certs: Certs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clean(monkeypatch)
    monkeypatch.setenv("WATCHD_TOKEN", VIEWER)
    async with _engine(tls_config(certs, mutual=True)) as engine:
        url = f"https://127.0.0.1:{engine.port}"
        tls = ["--ca-file", str(certs.ca), "--client-cert", str(certs.client_cert)]
        code, _, err = await watchd(
            capsys, "status", "--url", url, *tls, "--client-key", str(certs.client_key)
        )
        assert code == 0, err
        # no client certificate: the handshake fails, which is "unreachable" with what to check
        code, _, err = await watchd(capsys, "status", "--url", url, "--ca-file", str(certs.ca))
        assert code == 3 and "cannot reach the engine" in err
        code, _, err = await watchd(capsys, "status", "--url", url, *tls)
        assert code == 2 and "together" in err  # a certificate without its key
        monkeypatch.setenv("WATCHD_URL", url)
        monkeypatch.setenv("WATCHD_CA_FILE", str(certs.ca))
        monkeypatch.setenv("WATCHD_CLIENT_CERT", str(certs.client_cert))
        monkeypatch.setenv("WATCHD_CLIENT_KEY", str(certs.client_key))
        code, out, err = await watchd(capsys, "status", "--json")
        assert code == 0 and '"mode": "enforce"' in out, err


async def test_an_unknown_ca_and_insecure(
    certs: Certs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clean(monkeypatch)
    monkeypatch.setenv("WATCHD_TOKEN", VIEWER)
    async with _engine(tls_config(certs, mutual=False)) as engine:
        url = f"https://127.0.0.1:{engine.port}"
        code, _, err = await watchd(capsys, "status", "--url", url)
        assert code == 3 and "--ca-file or $WATCHD_CA_FILE" in err
        code, _, err = await watchd(capsys, "status", "--url", url, "--insecure")
        assert code == 0 and "is not verified (--insecure)" in err


def test_config_of_a_tls_engine_gives_https(certs: Certs, tmp_path: Path) -> None:
    config = tmp_path / "engine.yaml"
    listen = {
        "host": "0.0.0.0",
        "port": 9443,
        "tls_cert": str(certs.server_cert),
        "tls_key": str(certs.server_key),
    }
    config.write_text(yaml.safe_dump({"listen": listen}))
    assert resolve(Settings(config=config), env={}).url == "https://127.0.0.1:9443"
    config.write_text(yaml.safe_dump({"listen": listen, "external_url": "https://watchd.example:9443/"}))
    assert resolve(Settings(config=config), env={}).url == "https://watchd.example:9443"
