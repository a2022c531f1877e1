"""Rule reload: on file change (and SIGHUP, which calls the same method), built completely before the swap."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.daemons import Daemon, free_port
from tests.support import eventually
from watchd.config import EngineConfig, ReloadConfig
from watchd.engine.runner import Engine
from watchd.http_settings import Listen

GOOD = "rules:\n  - {name: first, match: {kind: xid}, actions: [log]}\n"
BETTER = "rules:\n  - {name: second, match: {kind: xid}, actions: [log]}\n"
BROKEN = "rules:\n  - {name: third, match: {xid: {regex: '('}}, actions: [log]}\n"
# found by Jinja's compiler, not its parser
UNKNOWN_FILTER = (
    "rules:\n  - {name: fourth, match: {kind: xid}, actions: [{log: {message: '{{ xid | nofilter }}'}}]}\n"
)


def bump(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, (st.st_atime, st.st_mtime + 1))  # a distinct mtime even within one clock tick


def watching(rules: Path) -> EngineConfig:
    """An engine that polls ``rules`` (a file or a folder) for changes every 50 ms."""
    return EngineConfig(
        listen=Listen(port=0),
        rules=[rules],
        default_rules=False,
        reload=ReloadConfig(poll_interval_s=0.05),
        slurm={"enabled": False},
    )


async def test_file_change_reloads_and_a_broken_file_keeps_the_old_rules(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(GOOD)
    async with Engine(watching(rules)) as engine:
        ok = engine.metrics.rules_reload_ok
        assert engine.rules.names == ["first"] and ok._value.get() == 1
        bump(rules, BROKEN)
        await eventually(lambda: ok._value.get() == 0, what="failed reload")
        assert engine.rules.names == ["first"]
        bump(rules, BETTER)
        await eventually(lambda: ok._value.get() == 1, what="reload")
        assert engine.rules.names == ["second"]
        bump(rules, UNKNOWN_FILTER)
        await eventually(lambda: ok._value.get() == 0, what="failed reload (unknown filter)")
        assert engine.rules.names == ["second"]
        bump(rules, GOOD)  # the watcher outlived both failures
        await eventually(lambda: ok._value.get() == 1, what="reload after the unknown filter")
        assert engine.rules.names == ["first"]


async def test_a_rules_folder_removed_and_restored_is_reloaded_not_a_crash(tmp_path: Path) -> None:
    folder = tmp_path / "rules.d"
    folder.mkdir()
    (folder / "a.yaml").write_text(GOOD)
    async with Engine(watching(folder)) as engine:
        ok = engine.metrics.rules_reload_ok
        moved = tmp_path / "moved"
        folder.rename(moved)
        await eventually(lambda: ok._value.get() == 0, what="failed reload (folder gone)")
        assert engine.rules.names == ["first"]
        moved.rename(folder)
        bump(folder / "a.yaml", BETTER)
        await eventually(lambda: ok._value.get() == 1, what="reload once the folder is back")
        assert engine.rules.names == ["second"]


async def test_a_dangling_link_added_is_refused_as_rules_check_refuses_it(tmp_path: Path) -> None:
    """Was: the watcher looked only at files it could stat, so a ``*.yaml`` link to nothing added to the
    folder never triggered a reload: the engine ran on, said nothing, and ``watchd rules check`` refused
    the same folder. Now the link is a change, the reload is refused as the check refuses it (the old rules
    stay, logged, counted), and removing it is a change too."""
    import io

    from watchd.rules.commands import run_check

    folder = tmp_path / "rules.d"
    folder.mkdir()
    (folder / "a.yaml").write_text(GOOD)
    async with Engine(watching(folder)) as engine:
        ok, failures = engine.metrics.rules_reload_ok, engine.metrics.rules_reload_failures
        (folder / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
        await eventually(lambda: ok._value.get() == 0, timeout=5, what="refused reload (dangling link)")
        assert failures._value.get() == 1 and engine.rules.names == ["first"]
        out = io.StringIO()
        assert run_check([folder], out, defaults=False) == 1 and "dangling link" in out.getvalue()
        (tmp_path / "nowhere.yaml").write_text(BETTER)  # the link's target appears: it loads
        await eventually(lambda: ok._value.get() == 1, timeout=5, what="reload once the target is there")
        assert engine.rules.names == ["first", "second"] and failures._value.get() == 1


@pytest.mark.real
def test_sighup_reloads_a_running_engine(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(GOOD)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "rules": [str(rules)],
        "default_rules": False,
        "reload": {"watch_files": False},
        "slurm": {"enabled": False},
        "log": {"format": "json"},
    }
    engine = Daemon("engine", config, tmp_path)
    try:
        engine.wait_ready()
        rules.write_text(BROKEN)
        engine.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "watchd_rules_last_reload_successful 0.0" not in engine.get("/metrics"):
            assert time.monotonic() < deadline, engine.log()
            time.sleep(0.05)
        assert engine.get_json("/api/v1/status")["rules"] == ["first"]
        rules.write_text(BETTER)
        engine.proc.send_signal(signal.SIGHUP)
        while engine.get_json("/api/v1/status")["rules"] != ["second"]:
            assert time.monotonic() < deadline, engine.log()
            time.sleep(0.05)
        assert "rules_reload_failed" in engine.log() and "bad regex" in engine.log()
    finally:
        assert engine.stop() == 0
