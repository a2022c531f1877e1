"""A secret written into a config file that its group or others may read is said: a warning naming the file
and the key (and how to fix it) in ``--check`` and at start, and ``watchd_config_inline_secrets`` on the
daemon's /metrics. A secret read from a file, or a config only its owner can read, says nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.daemons import Daemon, agent_config, engine_config
from tests.harness.ports import free_port
from tests.support import wait_for
from watchd.cli import main
from watchd.config import EngineConfig, parse_config
from watchd.credentials import inline_secrets


def test_the_inline_secrets_of_a_config_are_found_by_key() -> None:
    config = parse_config(
        EngineConfig,
        {
            "auth": {
                "token": "agents",
                "operators": [{"name": "alice", "token": "a"}, {"name": "bob", "token_file": "/etc/b"}],
                "viewers": [{"name": "grafana", "token_env": "GRAFANA"}],
            },
            "alertmanager": {
                "urls": ["https://am:9093"],
                "basic_auth": {"username": "watchd", "password": "pw"},
            },
            "state": {"kind": "postgres", "postgres": {"dsn": "postgresql://watchd:pw@db/watchd"}},
        },
        "engine.yaml",
    )
    assert inline_secrets(config) == [
        "auth.token",
        "auth.operators[0].token",
        "state.postgres.dsn",
        "alertmanager.basic_auth.password",
    ]
    without = parse_config(EngineConfig, {"state": {"kind": "postgres", "postgres": {"dsn": "host=db"}}}, "e")
    assert inline_secrets(without) == []  # a connection string without a password is no secret


def _engine_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"auth": {"token": "s3cret"}, "slurm": {"enabled": False}}))
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_engine_check_warns_of_a_token_inline_in_a_readable_config(
    mode: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _engine_file(tmp_path, mode)
    assert main(["engine", "--config", str(path), "--check"]) == 0  # a warning, not an error
    err = capsys.readouterr().err
    who = "others" if mode & 0o004 else "its group"
    said = f"warning: {path} (mode {mode:04o}) is readable by {who} and holds the secret auth.token inline"
    assert said in err
    assert "mode 0600" in err and "token_file" in err


def test_a_config_only_its_owner_reads_is_not_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _engine_file(tmp_path, 0o600)
    assert main(["engine", "--config", str(path), "--check"]) == 0
    assert "inline" not in capsys.readouterr().err


def test_agent_check_warns_of_its_inline_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"engine": {"auth": {"token": "s3cret"}}}))
    path.chmod(0o644)
    assert main(["agent", "--config", str(path), "--check"]) == 0
    assert f"{path} (mode 0644) is readable by others and holds the secret engine.auth.token" in (
        capsys.readouterr().err
    )


def _metric(daemon: Daemon) -> float:
    for line in daemon.get("/metrics").splitlines():
        if line.startswith("watchd_config_inline_secrets "):
            return float(line.split()[1])
    raise AssertionError("watchd_config_inline_secrets not exported")


@pytest.mark.real
def test_both_daemons_log_and_export_their_inline_secrets_at_start(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    token.chmod(0o600)
    config = engine_config(free_port(), token, "dry-run", None)
    config["auth"] = {"token": "s3cret"}  # inline, in a file Daemon writes world-readable (0644)
    engine = Daemon("engine", config, tmp_path)
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    agent_cfg = agent_config("gpu-1", engine.port, token, kernel_log)
    agent_cfg["engine"]["auth"] = {"token": "s3cret"}  # and its heartbeat secret is inline too
    agent = Daemon("agent", agent_cfg, tmp_path)
    try:
        engine.wait_ready()
        agent.wait_ready()
        assert _metric(engine) == 1
        assert _metric(agent) == 2
        logged = wait_for(
            lambda: [line for line in agent.log_path.read_text().splitlines() if "secret_inline_in" in line],
            what="the agent's warnings",
        )
        assert any('"key": "engine.auth.token"' in line for line in logged), logged
        assert any('"key": "heartbeat.token_secret.token"' in line for line in logged), logged
        assert str(agent.config_path) in logged[0]
    finally:
        agent.stop()
        engine.stop()
