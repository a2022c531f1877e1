"""``watchd engine --check`` and ``watchd agent --check`` refuse every config the daemon refuses at start: one
config per class of what the start reads or checks beyond the config's own schema (cross-checks of the
tokens, secret and TLS files, the state database's settings, the Alertmanager's credentials, the Kubernetes
credentials a part needs; the agent's TLS, heartbeat secret and GPU reset backend). Each used to pass the
check and stop the daemon at start; both now say the same thing."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from watchd.agent.runner import Agent
from watchd.cli import main
from watchd.config import AgentConfig, EngineConfig, load_config
from watchd.engine.runner import Engine
from watchd.errors import ConfigError

MISSING = "/nonexistent/watchd"
CHECKS = {"enabled": True, "items": [{"name": "nhc", "type": "command", "command": ["/bin/true"]}]}

ENGINE: dict[str, tuple[dict[str, Any], str]] = {
    "agents' token shared with an operator": (
        {"auth": {"token": "same", "operators": [{"name": "alice", "token": "same"}]}},
        "auth: the agents' token is also an operator's or viewer's",
    ),
    "operator's token file missing": (
        {"auth": {"token": "t", "operators": [{"name": "alice", "token_file": f"{MISSING}/alice"}]}},
        "auth.operators[0] (alice).token_file: cannot read",
    ),
    "listener TLS files missing": (
        {"listen": {"port": 0, "tls_cert": f"{MISSING}/c.pem", "tls_key": f"{MISSING}/k.pem"}},
        "listen.tls_cert/tls_key/client_ca: cannot load",
    ),
    "PostgreSQL connection string from an unset variable": (
        {"state": {"kind": "postgres", "postgres": {"dsn_env": "WATCHD_TEST_UNSET_DSN"}}},
        "state.postgres.dsn_env: environment variable WATCHD_TEST_UNSET_DSN is not set",
    ),
    "SQLite database under a file": (
        {"state": {"path": "{tmp}/a-file/state.db"}},
        "state.path: cannot create",
    ),
    "Alertmanager CA missing": (
        {"alertmanager": {"urls": ["https://am.example:9093"], "ca_file": f"{MISSING}/ca.pem"}},
        "alertmanager.ca_file/client_cert/client_key: cannot load",
    ),
    "Alertmanager password from an unset variable": (
        {
            "alertmanager": {
                "urls": ["https://am.example:9093"],
                "basic_auth": {"username": "watchd", "password_env": "WATCHD_TEST_UNSET_PW"},
            }
        },
        "alertmanager.basic_auth.password_env: environment variable WATCHD_TEST_UNSET_PW is not set",
    ),
    "Kubernetes credentials missing for the check jobs": (
        {"checks": {**CHECKS, "runner": "kubernetes"}, "kubernetes": {"kubeconfig": f"{MISSING}/kubeconfig"}},
        "kubernetes.kubeconfig/context/in_cluster:",
    ),
}

AGENT: dict[str, tuple[dict[str, Any], str]] = {
    "engine CA missing": (
        {"engine": {"url": "https://engine.example:9120", "ca_file": f"{MISSING}/ca.pem"}},
        "engine.ca_file/client_cert/client_key: cannot load",
    ),
    "listener TLS files missing": (
        {"listen": {"port": 0, "tls_cert": f"{MISSING}/c.pem", "tls_key": f"{MISSING}/k.pem"}},
        "listen.tls_cert/tls_key/client_ca: cannot load",
    ),
    "heartbeat secret file missing": (
        {"heartbeat": {"socket": None, "token_secret": {"token_file": f"{MISSING}/secret"}}},
        "heartbeat.token_secret.token_file: cannot read",
    ),
    "fake GPU reset without the fake GPU": (
        {"commands": {"state_file": None, "gpu_reset": {"backend": "fake"}}},
        "commands.gpu_reset.backend fake: needs sources.gpu.backend fake",
    ),
    "spool under a file": (
        {"shipper": {"spool_file": "{tmp}/a-file/spool.jsonl"}},
        "shipper.spool_file:",
    ),
}


def _write(tmp_path: Path, name: str, data: dict[str, Any]) -> Path:
    (tmp_path / "a-file").write_text("")
    text = yaml.safe_dump(data).replace("{tmp}", str(tmp_path))
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.fixture(autouse=True)
def _unset() -> None:
    for name in ("WATCHD_TEST_UNSET_DSN", "WATCHD_TEST_UNSET_PW"):
        assert name not in os.environ


async def _start_engine(path: Path) -> None:
    async with Engine(load_config(EngineConfig, path)):
        pass


async def _start_agent(path: Path) -> None:
    async with Agent(load_config(AgentConfig, path)):
        pass


@pytest.mark.parametrize("case", ENGINE)
def test_engine_check_refuses_what_the_start_refuses(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra, message = ENGINE[case]
    path = _write(tmp_path, "engine.yaml", {"listen": {"port": 0}, "slurm": {"enabled": False}, **extra})
    assert main(["engine", "--config", str(path), "--check"]) == 2
    assert message in capsys.readouterr().err
    with pytest.raises(ConfigError) as refused:
        asyncio.run(_start_engine(path))
    assert message in str(refused.value)


@pytest.mark.parametrize("case", AGENT)
def test_agent_check_refuses_what_the_start_refuses(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra, message = AGENT[case]
    base: dict[str, Any] = {
        "node": "gpu-1",
        "listen": {"port": 0},
        "sources": {"kmsg": {"enabled": False}},
        "heartbeat": {"socket": None},
        "commands": {"state_file": None},
        "shipper": {"spool_file": None},
    }
    path = _write(tmp_path, "agent.yaml", {**base, **extra})
    assert main(["agent", "--config", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {message}" in err
    with pytest.raises(ConfigError) as refused:
        asyncio.run(_start_agent(path))
    assert message in str(refused.value)
