"""Check outputs nobody else can forge, on the real Slurm test cluster: a user (uid 65534, ``nobody``) who
can write where the check jobs' outputs land replaces a job's output between the job's end and the engine's
read (a forged pass, a forged failure, a FIFO, a symlink to a pass, another job's genuine output). None of
them may pass a node or drain it: each is an ``error`` verdict naming why the output was refused, a
validation keeps the node drained, and the engine keeps answering meanwhile (a FIFO froze it before). An
output folder others can write is refused at start.

The attacker acts from a wrapper around ``scontrol``: once ``scontrol show job`` reports the check's job
ended, before the engine reads the output (a race the attacker can win; here it always does). The folder is
made writable by everyone after the engine started (the engine refuses to start with it so): what the
engine reads must be safe even then."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.checks.conftest import DATA, behave
from tests.checks.test_validation_kill9 import TOKEN, engine_config
from tests.daemons import Daemon, watchd_command
from tests.harness.slurm import SlurmCluster
from tests.support import xid_event
from watchd.model.events import INGEST_PATH, batch_to_wire

pytestmark = pytest.mark.slurm

NOBODY = 65534
EVIDENCE = "watchd: nccl busbw 312 GB/s < 80% of 450 GB/s"

WRAPPER = """#!/bin/sh
# scontrol, with an attacker (uid 65534) acting on a check job's output once the job has ended and before
# the engine reads it
real="$WATCHD_REAL_SCONTROL"
case " $* " in
  *" show job -o "*) ;;
  *) exec "$real" "$@" ;;
esac
out=$("$real" "$@"); rc=$?
if [ -f "$WATCHD_ATTACK" ] && [ ! -e "$WATCHD_ATTACK.done" ]; then
  case "$out" in
    *JobState=COMPLETED*|*JobState=FAILED*)
      path=$(printf '%s\\n' "$out" | sed -n 's/.* StdOut=\\([^ ]*\\).*/\\1/p')
      setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 "$WATCHD_ATTACK" "$path" \\
        > "$WATCHD_ATTACK.log" 2>&1
      echo "$path" > "$WATCHD_ATTACK.done" ;;
  esac
fi
printf '%s\\n' "$out"
exit $rc
"""

#: what the attacker puts where the job's output was (the job's own output moved out of the way first)
ATTACKS = {
    "forged-pass": "open(path, 'w').write(open(PAYLOAD / 'pass.txt').read())",
    "forged-failure": "open(path, 'w').write(open(PAYLOAD / 'crash.txt').read())",
    "fifo": "os.mkfifo(path, 0o666)",
    "symlink-to-a-pass": "os.symlink(PAYLOAD / 'pass.txt', path)",  # a pass file the engine's user owns
    "another-jobs-output": "os.rename(open(PAYLOAD / 'other').read().strip(), path)",  # a real earlier pass
}


#: why each is refused (the evidence names it)
REFUSED = {
    "forged-pass": "owned by uid 65534, not by 0",
    "forged-failure": "owned by uid 65534, not by 0",
    "fifo": "not a regular file (a FIFO)",
    "symlink-to-a-pass": "a symbolic link (not followed)",
    "another-jobs-output": "not this run's output",
}


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder the attacker can reach (pytest's tmp_path is under a 0700 folder of root's)."""
    d = Path(tempfile.mkdtemp(prefix="watchd-forgery-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def arm(base: Path, attack: str) -> None:
    script = base / "attack.py"
    script.write_text(
        "import os, sys\nfrom pathlib import Path\n"
        f"PAYLOAD = Path({str(base / 'payload')!r})\n"
        "path = sys.argv[1]\nos.rename(path, path + '.moved')\n" + ATTACKS[attack] + "\n"
    )
    script.chmod(0o644)


def attacked(base: Path) -> bool:
    return (base / "attack.py.done").exists()


def scene(cluster: SlurmCluster, standins: Path, base: Path) -> dict[str, Any]:
    payload = base / "payload"
    payload.mkdir(mode=0o755)
    (payload / "pass.txt").write_text((DATA / "nccl" / "h100-8gpu-single-node-pass.txt").read_text())
    (payload / "crash.txt").write_text((DATA / "nccl" / "h100-cuda-failure.txt").read_text())
    for f in payload.iterdir():
        f.chmod(0o644)
    wrapper = base / "scontrol"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    config = engine_config(cluster, standins, base, wrapper)  # out/ 0750, what the engine asks for
    config["safety"] = {"max_fraction": 1.0}
    config["checks"]["items"] = config["checks"]["items"][:1]  # nccl alone
    return config


def post(daemon: Daemon, path: str, body: Any, timeout: float = 60) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{daemon.url}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {TOKEN}",
            "X-Watchd-Operator": "alice",
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not in {timeout} s: {what}")
        time.sleep(0.1)


def engine(cluster: SlurmCluster, config: dict[str, Any], base: Path, attackable: bool = True) -> Daemon:
    real = shutil.which("scontrol")
    assert real is not None
    daemon = Daemon(
        "engine", config, base, {"WATCHD_REAL_SCONTROL": real, "WATCHD_ATTACK": str(base / "attack.py")}
    )
    daemon.wait_ready()
    if attackable:
        (base / "out").chmod(0o777)  # from now on the attacker can write there
    return daemon


@pytest.mark.parametrize("attack", ["forged-pass", "symlink-to-a-pass", "another-jobs-output"])
def test_a_forged_pass_never_returns_a_degraded_node_to_service(
    attack: str, cluster: SlurmCluster, standins: Path, base: Path
) -> None:
    behave(standins, gpu_1="low", gpu_2="pass")  # gpu-1 is degraded: its real output fails
    cluster.drain("gpu-1", EVIDENCE)
    daemon = engine(cluster, scene(cluster, standins, base), base)
    try:
        if attack == "another-jobs-output":  # a real pass of another node, written by an earlier check job
            status, body = post(daemon, "/api/v1/checks/run", {"nodes": ["gpu-2"], "checks": ["nccl"]})
            assert status == 200 and body["results"][0]["outcome"] == "passed", body
            [other] = [p for p in (base / "out").iterdir() if p.name.startswith("nccl.gpu-2.")]
            assert other.stat().st_mode & 0o777 == 0o600  # the job's output is its user's alone
            (base / "payload" / "other").write_text(f"{other}\n")
            (base / "payload" / "other").chmod(0o644)
        arm(base, attack)
        status, body = post(daemon, "/api/v1/nodes/gpu-1/validate", {})
        assert attacked(base), (base / "attack.py.log").read_text()
        assert body["outcome"] == "drained", body
        [run] = body["results"]
        assert run["outcome"] == "error" and "check output refused" in run["evidence"], run
        assert REFUSED[attack] in run["evidence"], run
        assert str(cluster.reason("gpu-1")).startswith("watchd: nccl failed (validate): "), cluster.reason(
            "gpu-1"
        )
        assert "DRAIN" in cluster.node_state("gpu-1")
    finally:
        daemon.stop()


def test_a_forged_failure_never_drains_a_healthy_node_and_pages(
    cluster: SlurmCluster, standins: Path, base: Path
) -> None:
    behave(standins, gpu_2="pass")
    daemon = engine(cluster, scene(cluster, standins, base), base)
    try:
        arm(base, "forged-failure")
        _, body = post(daemon, "/api/v1/checks/run", {"nodes": ["gpu-2"], "checks": ["nccl"]})
        assert attacked(base), (base / "attack.py.log").read_text()
        [run] = body["results"]
        assert run["outcome"] == "error" and "check output refused" in run["evidence"], run
        assert REFUSED["forged-failure"] in run["evidence"], run
        time.sleep(1.0)  # the rules had their turn
        assert cluster.reason("gpu-2") is None and "DRAIN" not in cluster.node_state("gpu-2")
        actions = daemon.get_json("/api/v1/actions?limit=50")["actions"]
        assert {(a["rule"], a["action"]) for a in actions if a["node"] == "gpu-2"} >= {
            ("check-output-refused", "alert")
        }, actions
        assert not [a for a in actions if a["action"] == "drain"], actions
    finally:
        daemon.stop()


def test_a_fifo_in_place_of_an_output_freezes_nothing(
    cluster: SlurmCluster, standins: Path, base: Path
) -> None:
    behave(standins, gpu_1="low")
    cluster.drain("gpu-1", EVIDENCE)
    daemon = engine(cluster, scene(cluster, standins, base), base)
    try:
        arm(base, "fifo")
        answer: dict[str, Any] = {}

        def validate() -> None:
            try:
                answer["validate"] = post(daemon, "/api/v1/nodes/gpu-1/validate", {}, timeout=40)
            except OSError as exc:
                answer["validate"] = (None, str(exc))

        thread = threading.Thread(target=validate, daemon=True)
        thread.start()
        wait(lambda: attacked(base), 30, "the FIFO in place of the output")
        path = Path((base / "attack.py.done").read_text().strip())
        assert stat.S_ISFIFO(path.lstat().st_mode)
        time.sleep(1.0)  # the engine has had the time to read where the FIFO sits
        batch = batch_to_wire("gpu-3", [xid_event(node="gpu-3", event_id=f"fifo-{time.time()}")])
        try:
            status, _ = post(daemon, INGEST_PATH, batch, timeout=5)
        except OSError as exc:
            raise AssertionError(
                f"the engine did not answer an Xid while a FIFO sat in its way: {exc}"
            ) from None
        assert status == 200
        wait(lambda: "DRAIN" in cluster.node_state("gpu-3"), 15, "gpu-3 drained for its Xid 79")
        assert str(cluster.reason("gpu-3")).startswith("watchd: Xid79 ")
        thread.join(40)
        status, body = answer["validate"]
        assert body["outcome"] == "drained", body
        [run] = body["results"]
        assert run["outcome"] == "error" and REFUSED["fifo"] in run["evidence"], run
        assert "DRAIN" in cluster.node_state("gpu-1")
    finally:
        daemon.stop()


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770, 0o730])
def test_an_output_folder_others_can_write_is_refused_at_start(
    mode: int, cluster: SlurmCluster, standins: Path, base: Path
) -> None:
    config = scene(cluster, standins, base)
    (base / "out").chmod(mode)
    path = base / "engine.yaml"
    import yaml

    path.write_text(yaml.safe_dump(config))
    check = subprocess.run(
        [*watchd_command(), "engine", "--check", "--config", str(path)], capture_output=True, text=True
    )
    assert check.returncode == 2, check
    assert "checks.output_dir" in check.stderr and f"{mode:04o}" in check.stderr, check.stderr
    assert "install -d -m 0750" in check.stderr, check.stderr
    run = subprocess.run(
        [*watchd_command(), "engine", "--config", str(path)], capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 2 and "checks.output_dir" in run.stderr, run
    assert (base / "out").stat().st_mode & 0o7777 == mode  # told, not changed


def test_a_restarted_engine_still_takes_its_jobs_own_output(
    cluster: SlurmCluster, standins: Path, base: Path
) -> None:
    """The secret line of a run in flight is in the state database: the next engine follows the job and
    takes its output."""
    behave(standins, gpu_2="slow")
    config = scene(cluster, standins, base)
    first = engine(cluster, config, base, attackable=False)

    def run() -> None:
        with contextlib.suppress(OSError):  # the engine is killed under it
            post(first, "/api/v1/checks/run", {"nodes": ["gpu-2"], "checks": ["nccl"]})

    try:
        threading.Thread(target=run, daemon=True).start()
        wait(
            lambda: (
                "watchd-check-nccl|gpu-2|RUNNING"
                in cluster.run("squeue", "-h", "-o", "%j|%N|%T", check=False).stdout
            ),
            30,
            "the check running",
        )
        os.kill(first.proc.pid, signal.SIGKILL)  # mid-run: its job goes on
        first.proc.wait()
    finally:
        first.stop()
    second = engine(cluster, config, base, attackable=False)
    try:
        wait(
            lambda: (
                [r["outcome"] for r in second.get_json("/api/v1/checks/history/gpu-2")["runs"]] == ["passed"]
            ),
            30,
            "the run followed to its end and judged",
        )
    finally:
        second.stop()
