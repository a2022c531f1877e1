"""Every operator command against a real engine process with authentication, reached three ways: the flags
(``--url``, ``--token-file``), the environment (``WATCHD_URL``, ``WATCHD_TOKEN``/``WATCHD_TOKEN_FILE``) and
the engine's own config (``--config``: its address, and the operator token named as this user); and the
exit statuses that tell usage (2), unreachable (3), refused (4), not enabled (5) and failed (1) apart."""

from __future__ import annotations

import getpass
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon, free_port, watchd_command
from tests.support import wait_for
from watchd.cli import main
from watchd.model.events import INGEST_PATH, Event, batch_to_wire

pytestmark = pytest.mark.real

AGENTS, OPERATOR, VIEWER = "agents-t0ken", "operator-t0ken", "viewer-t0ken"
NODES = [f"gpu-{i}" for i in range(1, 13)]
WAYS = ("flags", "env", "config")


class Bench:
    def __init__(self, engine: Daemon, tmp: Path) -> None:
        self.engine = engine
        self.tmp = tmp
        self.operator_file = tmp / "operator"
        self.viewer_file = tmp / "viewer"

    def argv(self, way: str, *args: str) -> tuple[list[str], dict[str, str]]:
        """The command line and the environment of one way of reaching the engine."""
        if way == "flags":
            return [*args, "--url", self.engine.url, "--token-file", str(self.operator_file)], {}
        if way == "env":
            return list(args), {"WATCHD_URL": self.engine.url, "WATCHD_TOKEN": OPERATOR}
        return [*args, "--config", str(self.engine.config_path)], {}


def _secret(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    tmp = tmp_path_factory.mktemp("reach")
    checks_out = tmp / "checks"
    checks_out.mkdir(mode=0o700)
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "auth": {
            "token_file": str(_secret(tmp / "agents", AGENTS)),
            # --config finds the operator token named as whoever runs the command
            "operators": [
                {"name": getpass.getuser(), "token_file": str(_secret(tmp / "operator", OPERATOR))}
            ],
            "viewers": [{"name": "grafana", "token_file": str(_secret(tmp / "viewer", VIEWER))}],
        },
        "mode": "enforce",
        "slurm": {"enabled": False},
        "fake": {"enabled": True, "nodes": NODES},
        "safety": {"max_fraction": 0.25, "max_nodes": 3},  # 3 of 12: the 4th to 6th drains are held
        "checks": {
            "enabled": True,
            "runner": "fake",
            "output_dir": str(checks_out),
            "items": [{"name": "alive", "type": "command", "command": ["/bin/true"]}],
        },
        "state": {"path": str(tmp / "state.db")},
    }
    engine = Daemon("engine", config, tmp)
    try:
        engine.wait_ready()
        events = [
            Event(f"x{i}", node, "kmsg", "xid", time.time(), {"xid": 79, "pci_bus_id": "0000:3b:00.0"})
            for i, node in enumerate(NODES[:6])
        ]
        for event in events:
            request = urllib.request.Request(
                engine.url + INGEST_PATH,
                data=json.dumps(batch_to_wire(event.node, [event])).encode(),
                headers={"Authorization": f"Bearer {AGENTS}", "Content-Type": "application/json"},
            )
            urllib.request.urlopen(request, timeout=10).close()
        engine.headers = {"Authorization": f"Bearer {OPERATOR}"}
        wait_for(lambda: len(engine.get_json("/api/v1/held")["held"]) >= 3, what="three held drains")
        yield Bench(engine, tmp)
    finally:
        engine.stop()


def run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str]
) -> tuple[int, str, str]:
    """``watchd ARGV`` in this process (the engine is the real process), with only ``env`` of WATCHD_*."""
    for name in ("WATCHD_URL", "WATCHD_TOKEN", "WATCHD_TOKEN_FILE", "WATCHD_CA_FILE", "WATCHD_TLS_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


READS = {
    "status": (["status", "--json"], lambda d: d["mode"] == "enforce"),
    "drains": (
        ["drains", "--refresh", "--json"],
        lambda d: {r["node"] for r in d["unavailable"]} >= set(NODES[:3]),
    ),
    "reliability": (["reliability", "--json"], lambda d: "fleet" in d),
    "actions list": (["actions", "list", "--json"], lambda d: len(d["held"]) >= 1),
    "node history": (["node", "history", "gpu-1", "--json"], lambda d: d["incidents"]),
    "checks list": (["checks", "list", "--json"], lambda d: d["checks"][0]["name"] == "alive"),
    "checks plan": (["checks", "plan", "--json"], lambda d: "plans" in d),
    "checks history": (["checks", "history", "gpu-12", "--json"], lambda d: d["node"] == "gpu-12"),
}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("command", list(READS))
def test_every_read_three_ways(
    bench: Bench, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str, way: str
) -> None:
    args, good = READS[command]
    code, out, err = run(capsys, monkeypatch, *bench.argv(way, *args))
    assert code == 0, err
    assert good(json.loads(out)), out


@pytest.mark.parametrize("way", WAYS)
def test_every_action_three_ways(
    bench: Bench, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    i = WAYS.index(way)
    # validate: a node watchd drained (gpu-1..3), its check suite passes, it is back in service
    node = NODES[i]
    code, out, err = run(capsys, monkeypatch, *bench.argv(way, "node", "validate", node, "--json"))
    assert code == 0 and json.loads(out)["outcome"] == "resumed", (out, err)
    # resume: a node in service is not drained, which is fine
    code, out, err = run(capsys, monkeypatch, *bench.argv(way, "node", "resume", NODES[9 + i], "--json"))
    assert code == 0 and json.loads(out)["outcome"] == "not_drained", (out, err)
    # a held action discarded
    held = bench.engine.get_json("/api/v1/held")["held"]
    held_id = str(held[0]["id"])
    code, out, err = run(capsys, monkeypatch, *bench.argv(way, "actions", "discard", held_id, "--json"))
    assert code == 0 and json.loads(out)["results"][0]["outcome"] == "discarded", (out, err)
    # checks run on a node in service
    code, out, err = run(capsys, monkeypatch, *bench.argv(way, "checks", "run", NODES[11], "--json"))
    assert code == 0 and json.loads(out)["results"][0]["passed"], (out, err)


def test_the_token_from_a_file_named_in_the_environment(
    bench: Bench, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"WATCHD_URL": bench.engine.url, "WATCHD_TOKEN_FILE": str(bench.operator_file)}
    code, out, err = run(capsys, monkeypatch, ["actions", "list"], env)
    assert code == 0 and "held actions (" in out, err


def test_a_flag_beats_the_environment_which_beats_the_config(
    bench: Bench, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    config = ["--config", str(bench.engine.config_path)]
    # the environment's URL over the config's: nobody there
    code, _, err = run(capsys, monkeypatch, ["status", *config], {"WATCHD_URL": nowhere})
    assert code == 3 and f"cannot reach the engine at {nowhere}" in err
    # the flag's over the environment's
    code, _, err = run(
        capsys, monkeypatch, ["status", *config, "--url", bench.engine.url], {"WATCHD_URL": nowhere}
    )
    assert code == 0, err
    # the environment's token over the config's operator token: a wrong one is refused
    code, _, err = run(capsys, monkeypatch, ["status", *config], {"WATCHD_TOKEN": "wrong"})
    assert code == 4 and "HTTP 401" in err and "$WATCHD_TOKEN" in err


def test_exit_statuses_tell_what_went_wrong(
    bench: Bench, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = ["--url", bench.engine.url]
    # refused: no token (401), a viewer acting (403)
    code, _, err = run(capsys, monkeypatch, ["actions", "list", *url], {})
    assert code == 4 and "HTTP 401: the engine wants a token" in err
    viewer = ["--token-file", str(bench.viewer_file)]
    code, _, err = run(capsys, monkeypatch, ["node", "resume", "gpu-12", *url, *viewer], {})
    assert code == 4 and "HTTP 403" in err
    code, _, err = run(capsys, monkeypatch, ["status", *url, *viewer], {})
    assert code == 0, err  # a viewer reads
    # unreachable
    code, _, err = run(capsys, monkeypatch, ["status", "--url", f"http://127.0.0.1:{free_port()}"], {})
    assert code == 3 and "is `watchd engine` running?" in err
    # usage: a file that is not there, an id that is not a number (argparse)
    code, _, err = run(capsys, monkeypatch, ["status", *url, "--token-file", str(bench.tmp / "nope")], {})
    assert code == 2 and "No such file" in err
    with pytest.raises(SystemExit) as usage:
        main(["actions", "release", "x"])
    assert usage.value.code == 2
    # failed: a held action that is not held
    code, out, _ = run(
        capsys, monkeypatch, ["actions", "release", "999999", *url], {"WATCHD_TOKEN": OPERATOR}
    )
    assert code == 1 and "not_held" in out


def test_checks_on_an_engine_without_them_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {"listen": {"host": "127.0.0.1", "port": free_port()}, "auth": {"token": AGENTS}}
    engine = Daemon("engine", config, tmp_path)
    try:
        engine.wait_ready()
        for args in (["checks", "list"], ["node", "validate", "gpu-1"], ["checks", "run", "gpu-1"]):
            code, _, err = run(capsys, monkeypatch, [*args, "--config", str(engine.config_path)], {})
            assert code == 5, err
            assert f"active checks are not enabled on the engine at {engine.url} (checks.enabled: true" in err
            assert "HTTP 404" not in err
    finally:
        engine.stop()


def test_exit_status_of_a_real_process_and_the_progress_line_stays_off_a_pipe(bench: Bench) -> None:
    res = subprocess.run(
        [*watchd_command(), "checks", "run", NODES[11], "--url", bench.engine.url],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "WATCHD_TOKEN": OPERATOR},
        check=False,
    )
    assert res.returncode == 0 and "passed" in res.stdout and res.stderr == "", res.stderr
