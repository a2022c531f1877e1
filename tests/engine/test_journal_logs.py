"""Logs under systemd: every line carries its syslog priority (``<3>`` for an error) when the output is the
journal, so ``journalctl -p err`` shows the errors; ``--log-level`` overrides the config's level."""

from __future__ import annotations

import json
import os
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry

from watchd import cli
from watchd.logs import configure_logging, get_logger, writes_to_journal


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def journal(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A file standing for the journal's stream: JOURNAL_STREAM names its device and inode (as systemd)."""
    stream = path.open("w")
    st = os.fstat(stream.fileno())
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    return stream


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_lines_to_the_journal_carry_their_syslog_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal"
    with journal(path, monkeypatch) as stream:
        assert writes_to_journal(stream)
        configure_logging("debug", "auto", stream)
        log = get_logger("watchd.test")
        log.error("store_failed", path="/var/lib/watchd/state.db")
        log.warning("slow")
        log.info("started")
        log.debug("detail")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("crashed")
    got = lines(path)
    assert [ln[:3] for ln in got] == ["<3>", "<4>", "<6>", "<7>", "<3>"]
    first = json.loads(got[0][3:])  # the rest of the line is the JSON line as before
    assert first["event"] == "store_failed" and first["level"] == "error"
    assert "RuntimeError: boom" in json.loads(got[4][3:])["exception"]


def test_no_prefix_when_the_output_is_not_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other"
    journal(tmp_path / "journal", monkeypatch).close()  # JOURNAL_STREAM names another file
    with other.open("w") as stream:
        assert not writes_to_journal(stream)
        configure_logging("info", "json", stream)
        get_logger("watchd.test").error("store_failed")
    assert json.loads(lines(other)[0])["event"] == "store_failed"
    monkeypatch.setenv("JOURNAL_STREAM", "not:numbers")
    with other.open("r") as stream:
        assert not writes_to_journal(stream)


def test_syslog_priority_always_and_never(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    path = tmp_path / "log"
    with path.open("w") as stream:
        configure_logging("info", "json", stream, syslog_priority="always")
        get_logger("watchd.test").error("one")
    assert lines(path)[0].startswith('<3>{"')
    with journal(path, monkeypatch) as stream:
        configure_logging("info", "json", stream, syslog_priority="never")
        get_logger("watchd.test").error("two")
    assert lines(path)[0].startswith('{"')


@pytest.mark.parametrize("daemon", ["engine", "agent"])
def test_log_level_option_overrides_the_config(
    daemon: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon starts with the option's level, not the config's; without the option, the config's."""
    calls: list[tuple[str, str, str]] = []

    def record(level: str, fmt: str, stream: Any = None, syslog_priority: str = "auto") -> None:
        calls.append((level, fmt, syslog_priority))

    class Nothing:  # stands for the daemon: nothing starts
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.reload_rules = lambda: True
            self.metrics = types.SimpleNamespace(registry=CollectorRegistry())  # the CLI adds its gauge

        async def __aenter__(self) -> Nothing:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

    async def serve(reload: Any = None) -> None:
        return None

    monkeypatch.setattr(cli, "configure_logging", record)
    monkeypatch.setattr(cli, "_serve_until_signalled", serve)
    monkeypatch.setattr("watchd.engine.runner.Engine", Nothing)
    monkeypatch.setattr("watchd.agent.runner.Agent", Nothing)
    config = tmp_path / f"{daemon}.yaml"
    config.write_text("log: {level: debug, format: json, syslog_priority: always}\n")
    monkeypatch.setenv("WATCHD_TOKEN", "secret")
    assert cli.main([daemon, "--config", str(config), "--log-level", "error"]) == 0
    assert cli.main([daemon, "--config", str(config)]) == 0
    assert calls == [("error", "json", "always"), ("debug", "json", "always")]


def test_log_level_option_refuses_an_unknown_level(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["engine", "--log-level", "loud"])
    assert exc.value.code == 2 and "invalid choice: 'loud'" in capsys.readouterr().err
