"""The command line as a user runs it: real processes, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.daemons import watchd_command

pytestmark = pytest.mark.real

ROOT = Path(__file__).parent.parent.parent


def watchd(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*watchd_command(), *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_version() -> None:
    res = watchd("version")
    assert res.returncode == 0 and res.stdout.startswith("watchd ")


def test_xid_from_stdin_as_json() -> None:
    dmesg = (
        "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
        "[ 1234.600000] some other line\n"
        "[ 1235.000000] NVRM: Xid (PCI:0009:1a:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception\n"
    )
    res = watchd("xid", "--json", stdin=dmesg)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(r["xid"], r["pci_bus_id"], r["pid"], r["process"]) for r in rows] == [
        (79, "0000:3b:00.0", 1234, "python3"),
        (13, "0009:1a:00.0", None, None),
    ]


def test_xid_table_from_file(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("Dec  2 10:00:01 node7 kernel: NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.\n")
    res = watchd("xid", str(log))
    assert res.returncode == 0
    header, row = res.stdout.splitlines()[:2]
    assert header.split()[:2] == ["PCI", "XID"]
    assert row.split()[:2] == ["0000:5d:00.0", "79"]


def test_missing_file_is_one_line_exit_2(tmp_path: Path) -> None:
    res = watchd("xid", str(tmp_path / "nope.log"))
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_broken_config_is_one_line_per_problem_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "engine.yaml"
    config.write_text("mode: sometimes\nslurm: {scontrl: x}\n")
    res = watchd("engine", "--config", str(config))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert f"{config}:1:7: mode:" in res.stderr
    assert f"{config}:2:9: slurm.scontrl: unknown key (did you mean 'scontrol'?)" in res.stderr


def test_broken_rule_file_is_reported(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: r\n    match: {xid: {regex: '('}}\n    actions: [log]\n")
    config = tmp_path / "engine.yaml"
    config.write_text(f"rules: [{rules}]\n")
    res = watchd("engine", "--config", str(config), "--check")
    assert res.returncode == 2 and "bad regex" in res.stderr and "Traceback" not in res.stderr


def test_shipped_configs_check_ok(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("secret\n")
    for person, token in (("operators/alice", "alice-secret\n"), ("viewers/grafana", "grafana-secret\n")):
        (tmp_path / person).parent.mkdir()
        (tmp_path / person).write_text(token)  # the files the example names: the engine reads them at start
        (tmp_path / person).chmod(0o600)
    for kind in ("engine", "agent"):
        text = (ROOT / "deploy" / f"{kind}.yaml").read_text()
        text = text.replace("/etc/watchd/rules", str(ROOT / "rules")).replace("/etc/watchd", str(tmp_path))
        (tmp_path / f"{kind}.yaml").write_text(text)
        res = watchd(kind, "--check", "--config", str(tmp_path / f"{kind}.yaml"))
        assert res.returncode == 0, res.stderr
    res = watchd("engine", "--check", "--config", str(tmp_path / "engine.yaml"))
    assert "mode dry-run" in res.stdout and "xid-fatal-hardware" in res.stdout


def test_demo_runs_by_itself_and_shows_the_drain() -> None:
    res = watchd("demo", timeout=60)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "Xid 79" in out and "xid-fatal-hardware matched" in out
    assert "drain" in out and "dry_run" in out and "latency" in out


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_units_verify(tmp_path: Path) -> None:
    exe = watchd_command()[0]
    for unit in (ROOT / "systemd").glob("*.service"):
        text = unit.read_text().replace("/usr/bin/watchd", exe)
        (tmp_path / unit.name).write_text(text)
    res = subprocess.run(
        ["systemd-analyze", "verify", *map(str, tmp_path.glob("*.service"))],
        capture_output=True,
        text=True,
        check=False,
    )
    problems = [line for line in res.stderr.splitlines() if "watchd" in line]
    assert res.returncode == 0 and not problems, res.stderr


def test_node_resume_without_a_running_engine_is_one_line_exit_3() -> None:
    from tests.daemons import free_port

    url = f"http://127.0.0.1:{free_port()}"
    res = watchd("node", "resume", "gpu-1", "--url", url)
    assert res.returncode == 3 and "Traceback" not in res.stderr  # unreachable: 3, not a usage error
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"watchd node: cannot reach the engine at {url}: ") and "watchd engine" in line


def _with_reader_gone(*args: str) -> subprocess.CompletedProcess[str]:
    """``watchd ARGS | head -0``, without the race: the pipe's reading end is closed before watchd starts."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [*watchd_command(), *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [("rules", "list"), ("rules", "schema"), ("version",), ("--help",)])
def test_a_reader_that_goes_away_ends_a_command_quietly(args: tuple[str, ...]) -> None:
    res = _with_reader_gone(*args)
    assert res.stderr == "" and res.returncode in (0, 141)


def test_checks_history_into_head_ends_quietly(tmp_path: Path) -> None:
    from tests.daemons import Daemon, free_port

    token = tmp_path / "token"
    token.write_text("t0ken\n")
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "auth": {"token_file": str(token)},
        "mode": "enforce",
        "slurm": {"enabled": False},
        "fake": {"enabled": True, "nodes": ["gpu-1"]},
        "checks": {
            "enabled": True,
            "runner": "fake",
            "items": [{"name": f"c{i}", "type": "command", "command": ["/bin/true"]} for i in range(3)],
        },
    }
    engine = Daemon("engine", config, tmp_path)
    try:
        engine.wait_ready()
        common = ("--url", engine.url, "--token-file", str(token))
        assert watchd("checks", "run", "gpu-1", *common).returncode == 0
        res = watchd("checks", "history", "gpu-1", *common)
        assert res.returncode == 0 and len(res.stdout.splitlines()) == 4, res.stderr
        res = _with_reader_gone("checks", "history", "gpu-1", *common)
        assert res.returncode == 141 and res.stderr == ""
    finally:
        engine.stop()
