"""Where each setting of :mod:`watchd.reach` comes from: the flag, else the environment, else ``--config``,
else the default; and which token ``--config`` picks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from watchd.errors import UsageError
from watchd.reach import DEFAULT_URL, Settings, resolve


def secret(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "engine.yaml"
    auth = {
        "token_file": str(secret(tmp_path / "agents", "agents")),
        "operators": [{"name": "alice", "token_file": str(secret(tmp_path / "alice", "alice-token"))}],
    }
    path.write_text(yaml.safe_dump({"listen": {"host": "::", "port": 9321}, "auth": auth}))
    return path


def test_the_defaults() -> None:
    target = resolve(Settings(), env={})
    assert (target.url, target.token, target.token_from, target.tls) == (DEFAULT_URL, None, "no token", None)


def test_flag_then_environment_then_config(config: Path, tmp_path: Path) -> None:
    mine = secret(tmp_path / "mine", "mine")
    env = {"WATCHD_URL": "http://env:1/", "WATCHD_TOKEN": "env-token"}
    assert resolve(Settings(config=config), env={}, user="alice").url == "http://127.0.0.1:9321"
    target = resolve(Settings(config=config), env=env, user="alice")
    assert (target.url, target.token, target.token_from) == ("http://env:1", "env-token", "$WATCHD_TOKEN")
    target = resolve(Settings(url="https://flag:2", token_file=mine, config=config), env=env, user="alice")
    assert (target.url, target.token) == ("https://flag:2", "mine")
    assert target.token_from == f"--token-file {mine}"


def test_config_picks_the_operator_named_as_the_user_else_the_shared_token(config: Path) -> None:
    alice = resolve(Settings(config=config), env={}, user="alice")
    assert alice.token == "alice-token" and "auth.operators[0] (alice)" in alice.token_from
    bob = resolve(Settings(config=config), env={}, user="bob")
    assert bob.token == "agents" and "the shared token" in bob.token_from


def test_a_token_file_from_the_environment(tmp_path: Path) -> None:
    path = secret(tmp_path / "t", "from-file")
    assert resolve(Settings(), env={"WATCHD_TOKEN_FILE": str(path)}).token == "from-file"
    with pytest.raises(UsageError, match="not both"):
        resolve(Settings(), env={"WATCHD_TOKEN_FILE": str(path), "WATCHD_TOKEN": "x"})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(UsageError, match="the file is empty"):
        resolve(Settings(token_file=tmp_path / "empty"), env={})


@pytest.mark.parametrize(
    ("settings", "env", "where"),
    [(Settings(url="ftp://x"), {}, "--url"), (Settings(), {"WATCHD_URL": "engine:9120"}, "$WATCHD_URL")],
)
def test_a_url_must_be_http_or_https(settings: Settings, env: dict[str, str], where: str) -> None:
    with pytest.raises(UsageError, match=rf"^\{where} .*: expected http:// or https://"):
        resolve(settings, env=env)
