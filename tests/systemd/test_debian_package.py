"""The Debian package under a real systemd: a minimal bookworm booted with systemd-nspawn (tests/harness/
nspawn.py), the .deb from ``make package`` installed with dpkg, both units started through ``systemctl``
and checked through ``systemctl``/``journalctl`` inside and the engine's HTTP API from here (the container
shares this host's network). The tests run in this order and share one container.

The figures docs/packaging.md quotes (package size, install time, start to READY, agent RSS) are written
to build/systemd-test-figures.json."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemons import free_port
from tests.harness import nspawn
from tests.support import XID79, real_components_required, wait_for
from watchd import __version__

pytestmark = pytest.mark.real

NODE = "ctr-node-1"
UNITS = ("watchd-engine", "watchd-agent")
KERNEL_LOG = "/var/log/watchd-test-kern.log"
SITE_RULE = {"name": "site-xid-drain", "match": {"kind": "xid", "xid": 79}, "actions": ["drain"]}
SECOND_RULE = {"name": "site-second", "match": {"kind": "xid", "xid": 31}, "actions": ["log"]}
FIGURES: dict[str, Any] = {}


class Booted:
    def __init__(self, box: nspawn.Container, deb: Path, engine_port: int) -> None:
        self.box, self.deb, self.engine_port = box, deb, engine_port
        self.token = (box.root / "etc/watchd/token").read_text().strip()

    def api(self, path: str) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.engine_port}{path}", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=5) as r:
            return json.loads(r.read())

    def write(self, path: str, text: str) -> None:
        (self.box.root / path.lstrip("/")).write_text(text)

    def main_pid(self, unit: str) -> int:
        return int(self.box.show(unit, "MainPID")["MainPID"])

    def proc(self, unit: str, name: str) -> str:
        """/proc/<MainPID>/<name> of the unit's process, read inside the container's PID namespace."""
        return self.box.run("cat", f"/proc/{self.main_pid(unit)}/{name}", check=True).stdout


def engine_config(port: int) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "auth": {"token_file": "/etc/watchd/token"},  # read through LoadCredential=token:/etc/watchd/token
        "mode": "dry-run",
        "rules": ["/etc/watchd/rules/site.yaml"],
        "reload": {"watch_files": False},  # only SIGHUP (systemctl reload) reloads here
        "slurm": {"enabled": False},
        "state": {"path": "/var/lib/watchd/engine.db"},
    }


def agent_config(engine_port: int) -> dict[str, Any]:
    return {
        "node": NODE,
        "engine": {"url": f"http://127.0.0.1:{engine_port}", "auth": {"token_file": "/etc/watchd/token"}},
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "sources": {
            "kmsg": {"enabled": False},  # no /dev/kmsg in a container
            "files": [{"path": KERNEL_LOG, "poll_interval_s": 0.2, "trust": "any-writer"}],
            "gpu": {"backend": "none"},
        },
        "heartbeat": {"http_port": 0},
        "shipper": {"backoff_initial_s": 0.05, "backoff_max_s": 1},
    }


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Booted]:
    ok, why = nspawn.available()
    if not ok:
        if real_components_required():
            pytest.fail(f"the systemd container is required here (CI) but cannot run: {why}")
        pytest.skip(why)
    start = time.monotonic()
    tarball = nspawn.rootfs_tarball()  # raises (never skips) when debootstrap fails
    FIGURES["rootfs_s"] = round(time.monotonic() - start, 1)
    start = time.monotonic()
    deb = nspawn.debian_package()
    FIGURES["package_s"] = round(time.monotonic() - start, 1)
    FIGURES["deb_bytes"] = deb.stat().st_size
    box = nspawn.Container(tmp_path_factory.mktemp("nspawn"), tarball)
    try:
        FIGURES["install_s"] = round(box.install(deb), 2)
        engine_port = free_port()
        root = box.root
        (root / "etc/watchd/rules").mkdir()
        (root / "etc/watchd/rules/site.yaml").write_text(yaml.safe_dump({"rules": [SITE_RULE]}))
        (root / "etc/watchd/engine.yaml").write_text(yaml.safe_dump(engine_config(engine_port)))
        (root / "etc/watchd/agent.yaml").write_text(yaml.safe_dump(agent_config(engine_port)))
        (root / KERNEL_LOG.lstrip("/")).write_text("")
        # The watchdog as shipped (30 s) with a short interval, so that a few missed pings fit in the test.
        for unit in ("watchd-engine", "watchd-agent"):
            dropin = root / f"etc/systemd/system/{unit}.service.d"
            dropin.mkdir(parents=True)
            (dropin / "test.conf").write_text("[Service]\nWatchdogSec=3\n")
        box.boot()
        yield Booted(box, deb, engine_port)
    finally:
        box.stop()
        out = nspawn.ROOT / "build" / "systemd-test-figures.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(FIGURES, indent=2) + "\n")


def test_the_package_installs_the_user_directories_and_units(booted: Booted) -> None:
    box = booted.box
    passwd = box.run("getent", "passwd", "watchd", check=True).stdout.split(":")
    assert passwd[5] == "/var/lib/watchd" and passwd[6].strip() == "/usr/sbin/nologin"
    assert box.run("stat", "-c", "%U %G %a", "/var/lib/watchd").stdout.split() == ["watchd", "watchd", "750"]
    assert box.run("stat", "-c", "%U %a", "/etc/watchd/token").stdout.split() == ["root", "600"]
    assert box.run("watchd", "--version", check=True).stdout.strip() == f"watchd {__version__}"
    for unit in ("watchd-engine.service", "watchd-agent.service"):
        # installed, not enabled: the host's role decides which one runs
        assert box.run("systemctl", "is-enabled", unit).stdout.strip() == "disabled"


def test_both_units_reach_active_through_notify(booted: Booted) -> None:
    box = booted.box
    for unit, key in (("watchd-engine", "engine_ready_s"), ("watchd-agent", "agent_ready_s")):
        start = time.monotonic()
        res = box.run("systemctl", "start", f"{unit}.service", timeout=90)  # returns at READY=1 (Type=notify)
        FIGURES[key] = round(time.monotonic() - start, 2)
        assert res.returncode == 0, f"{res.stderr}\n{box.journal(unit)}"
        props = box.show(unit, "Type", "ActiveState", "SubState", "NotifyAccess", "StatusErrno")
        assert props["Type"] == "notify" and props["ActiveState"] == "active", props
        assert props["SubState"] == "running", props
    FIGURES["agent_rss_kib_package"] = _rss_kib(booted.proc("watchd-agent", "status"))
    FIGURES["engine_rss_kib_package"] = _rss_kib(booted.proc("watchd-engine", "status"))


def _rss_kib(status: str) -> int:
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))


def test_the_engine_runs_as_watchd_with_its_limits_and_owns_its_state(booted: Booted) -> None:
    box = booted.box
    status = booted.proc("watchd-engine", "status")
    uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
    assert box.run("getent", "passwd", uid).stdout.startswith("watchd:")
    limits = booted.proc("watchd-engine", "limits")
    [nofile] = [line for line in limits.splitlines() if line.startswith("Max open files")]
    # LimitNOFILE=65536, unless the machine's own hard limit (the container's PID 1's) is lower
    pid1 = box.run("cat", "/proc/1/limits", check=True).stdout
    [ceiling] = [int(line.split()[4]) for line in pid1.splitlines() if line.startswith("Max open files")]
    FIGURES["engine_nofile"] = nofile.split()[3]
    assert nofile.split()[3:5] == [str(min(65536, ceiling))] * 2, (nofile, ceiling)
    assert "http_max_connections_lowered" not in box.journal("watchd-engine")
    stat = box.run("stat", "-c", "%U %a", "/var/lib/watchd", "/var/lib/watchd/engine.db", check=True)
    dirmode, dbmode = stat.stdout.splitlines()
    assert dirmode == "watchd 750" and dbmode.split()[0] == "watchd", stat.stdout
    assert int(dbmode.split()[1], 8) & 0o007 == 0  # UMask=0027: nothing for others
    # the agent (root) keeps its state apart and never takes /var/lib/watchd back
    assert box.run("stat", "-c", "%U %a", "/var/lib/watchd-agent").stdout.split() == ["root", "700"]
    # the token reached the engine as a credential, readable by its user only
    creds = box.run("ls", "-l", "/run/credentials/watchd-engine.service/token").stdout
    assert creds.startswith("-r--------") and " watchd " in creds, creds


def test_the_watchdog_is_pinged_and_nothing_restarts(booted: Booted) -> None:
    box = booted.box
    before = {u: box.show(u, "MainPID", "WatchdogTimestampMonotonic", "NRestarts") for u in UNITS}
    time.sleep(7.5)  # more than twice WatchdogSec=3: a unit that did not ping would have been killed
    for unit in UNITS:
        after = box.show(
            unit, "MainPID", "WatchdogTimestampMonotonic", "NRestarts", "ActiveState", "WatchdogUSec"
        )
        assert after["WatchdogUSec"] == "3s", after
        assert after["ActiveState"] == "active" and after["NRestarts"] == "0", after
        assert after["MainPID"] == before[unit]["MainPID"]
        assert int(after["WatchdogTimestampMonotonic"]) > int(before[unit]["WatchdogTimestampMonotonic"]) > 0


def test_an_xid_in_the_agents_source_is_decided_by_the_engine(booted: Booted) -> None:
    line = f"Dec  5 10:00:00 {NODE} kernel: [12345.678901] {XID79}\n"
    with open(booted.box.root / KERNEL_LOG.lstrip("/"), "a") as f:
        f.write(line)

    def decided() -> list[dict[str, Any]]:
        return [
            a
            for a in booted.api("/api/v1/actions?limit=100")["actions"]
            if a.get("rule") == SITE_RULE["name"] and a.get("node") == NODE
        ]

    [action] = wait_for(decided, timeout=30, what="the engine's decision on the Xid")
    assert action["action"] == "drain", action


def test_systemctl_reload_reloads_the_rules(booted: Booted) -> None:
    assert SECOND_RULE["name"] not in booted.api("/api/v1/status")["rules"]
    booted.write("/etc/watchd/rules/site.yaml", yaml.safe_dump({"rules": [SITE_RULE, SECOND_RULE]}))
    pid = booted.main_pid("watchd-engine")
    booted.box.run("systemctl", "reload", "watchd-engine", check=True)
    wait_for(lambda: SECOND_RULE["name"] in booted.api("/api/v1/status")["rules"], 15, "the reloaded rules")
    assert booted.main_pid("watchd-engine") == pid  # reloaded in place, not restarted
    assert "rules_reloaded" in booted.box.journal("watchd-engine")


def test_an_upgrade_keeps_the_edited_configs_and_the_state(booted: Booted) -> None:
    box = booted.box
    edited = (box.root / "etc/watchd/engine.yaml").read_text()
    db_inode = box.run("stat", "-c", "%i", "/var/lib/watchd/engine.db", check=True).stdout
    shutil.copy(booted.deb, box.root / "var/tmp" / booted.deb.name)  # /tmp inside is a tmpfs
    res = box.run(
        "dpkg", "-i", f"/var/tmp/{booted.deb.name}", timeout=300
    )  # the same version: an upgrade path
    assert res.returncode == 0, res.stdout + res.stderr
    assert (box.root / "etc/watchd/engine.yaml").read_text() == edited
    assert box.run("stat", "-c", "%i", "/var/lib/watchd/engine.db").stdout == db_inode
    # the running engine was restarted on the new code and still knows its decision
    assert box.show("watchd-engine", "ActiveState")["ActiveState"] == "active"
    wait_for(lambda: _healthy(booted), 30, "the engine after the upgrade")
    actions = booted.api("/api/v1/actions?limit=100")["actions"]
    assert any(a.get("rule") == SITE_RULE["name"] for a in actions)


def _healthy(booted: Booted) -> bool:
    try:
        booted.api("/api/v1/status")
    except OSError:
        return False
    return True


def test_a_bad_config_fails_once_naming_the_key(booted: Booted) -> None:
    box = booted.box
    good = (box.root / "etc/watchd/engine.yaml").read_text()
    bad = engine_config(booted.engine_port)
    bad["ingest"] = {"queue_sise": 10}
    booted.write("/etc/watchd/engine.yaml", yaml.safe_dump(bad))
    try:
        res = box.run("systemctl", "restart", "watchd-engine", timeout=60)
        assert res.returncode != 0
        time.sleep(5)  # RestartSec=2: a retry would have happened by now
        props = box.show("watchd-engine", "ActiveState", "Result", "NRestarts", "ExecMainStatus")
        assert props["ActiveState"] == "failed" and props["ExecMainStatus"] == "2", props
        assert props["NRestarts"] == "0", props
        assert "queue_sise" in box.journal("watchd-engine", "--since", "-1min")
        errors = box.journal("watchd-engine", "--since", "-1min", "-p", "err")
        assert "ingest.queue_sise: unknown key" in errors, errors  # filed at error priority
    finally:
        booted.write("/etc/watchd/engine.yaml", good)
    box.run("systemctl", "reset-failed", "watchd-engine")
    box.run("systemctl", "start", "watchd-engine", check=True, timeout=90)


def test_security_exposure_of_both_units(booted: Booted) -> None:
    """``systemd-analyze security`` inside: the scores docs/packaging.md quotes, and no regression."""
    for unit, ceiling in (("watchd-engine", 1.5), ("watchd-agent", 3.0)):
        out = booted.box.run(
            "systemd-analyze", "security", "--no-pager", f"{unit}.service", check=True
        ).stdout
        (nspawn.ROOT / "build" / f"{unit}.security.txt").write_text(out)
        score = float(re.search(r"exposure level for \S+: ([\d.]+)", out)[1])  # type: ignore[index]
        FIGURES[f"{unit}_exposure"] = score
        assert score <= ceiling, out


def test_remove_keeps_the_state_and_only_purge_deletes_it(booted: Booted) -> None:
    box = booted.box
    res = box.run("dpkg", "--remove", "watchd", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert box.run("systemctl", "is-active", "watchd-engine").stdout.strip() != "active"
    assert box.run("test", "-s", "/var/lib/watchd/engine.db").returncode == 0
    assert box.run("test", "-e", "/etc/watchd/engine.yaml").returncode == 0  # conffiles stay until purge
    assert box.run("test", "-e", "/opt/watchd/bin/watchd").returncode != 0
    res = box.run("dpkg", "--purge", "watchd", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for gone in ("/var/lib/watchd", "/etc/watchd/engine.yaml", "/etc/watchd/token"):
        assert box.run("test", "-e", gone).returncode != 0, gone


def test_agent_rss_from_the_dev_venv(tmp_path: Path) -> None:
    """The same agent config from this checkout's interpreter, for the package's RSS figure."""
    log = tmp_path / "kern.log"
    log.write_text("")
    config = agent_config(free_port())
    config["sources"]["files"][0]["path"] = str(log)
    config["engine"]["auth"] = {"token": "x"}
    config["heartbeat"]["socket"] = None
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "watchd", "agent", "--config", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(nspawn.ROOT)},
    )
    try:
        time.sleep(4)
        assert proc.poll() is None
        FIGURES["agent_rss_kib_dev_venv"] = _rss_kib(Path(f"/proc/{proc.pid}/status").read_text())
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_client_wheel_imports_in_a_fresh_venv_without_the_daemons_dependencies(tmp_path: Path) -> None:
    nspawn.debian_package()  # make package: dist/ holds the client wheel beside the .deb
    [wheel] = (nspawn.ROOT / "dist").glob("watchd_client-*-py3-none-any.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pip = [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "-q", "--no-index", str(wheel)], check=True, env=env)
    probe = (
        "import sys, watchd.client as c; assert c.Heartbeat; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'aiohttp', 'yaml', 'structlog', 'jinja2', 'watchd')))"
    )
    res = subprocess.run(
        [str(venv / "bin/python"), "-I", "-c", probe], capture_output=True, text=True, env=env, check=False
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "['watchd', 'watchd.client']"
    listed = subprocess.run(
        [*pip, "list", "--format=freeze"], capture_output=True, text=True, env=env, check=True
    )
    installed = {line.split("==")[0].lower() for line in listed.stdout.split()}
    assert installed - {"pip", "setuptools"} == {"watchd-client"}, installed
