"""What the break-fix loops on the real Slurm cluster share (a reboot: test_break_fix_loop.py, a GPU reset:
test_gpu_reset_loop.py): a real engine on the shipped defaults with checks, a real agent reading a kernel log,
the node's audit trail, and a wait that says, when it fails, where the loop stopped."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.checks.test_validation_kill9 import TOKEN, WRAPPER
from tests.checks.test_validation_kill9 import engine_config as checks_engine_config
from tests.daemons import Daemon, agent_config, watchd_command
from tests.harness.slurm import SlurmCluster
from tests.harness.slurm import available as slurm_available
from tests.support import real_components_required, wait_for

REAL_SCONTROL = shutil.which("scontrol") or "scontrol"


def start_engine(
    cluster: SlurmCluster,
    standins: Path,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    configure: Callable[[dict[str, Any]], None] | None = None,
) -> Daemon:
    """A real engine on the defaults, with checks; its scontrol the kill -9 test's wrapper when ``env``
    names the real one; ``configure`` changes its config."""
    scontrol = tmp_path / "scontrol" if env else Path(REAL_SCONTROL)
    if env:
        scontrol.write_text(WRAPPER)
        scontrol.chmod(0o755)
    config = checks_engine_config(cluster, standins, tmp_path, scontrol)
    config["auth"] = {"token_file": str(tmp_path / "token")}
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    if configure is not None:
        configure(config)
    engine = Daemon("engine", config, tmp_path, env)
    engine.wait_ready()
    return engine


def start_agent(
    engine: Daemon, tmp_path: Path, node: str, configure: Callable[[dict[str, Any]], None] | None = None
) -> tuple[Daemon, Path]:
    """A real agent of ``node`` reading an empty kernel log (returned); ``configure`` changes its config."""
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    config = agent_config(node, engine.port, tmp_path / "token", kernel_log)
    if configure is not None:
        configure(config)
    agent = Daemon("agent", config, tmp_path)
    agent.wait_ready()
    return agent, kernel_log


def kernel_says(kernel_log: Path, line: str) -> None:
    with open(kernel_log, "a") as f:
        f.write(line + "\n")


def actions(engine: Daemon, node: str) -> list[dict[str, Any]]:
    return [a for a in engine.get_json("/api/v1/actions?limit=500")["actions"] if a["node"] == node]


def steps(engine: Daemon, node: str) -> list[tuple[str, str]]:
    """The node's actions and their outcomes, alerts left out."""
    return [(a["action"], a["outcome"]) for a in actions(engine, node) if a["action"] != "alert"]


def back_in_service(cluster: SlurmCluster, engine: Daemon, node: str) -> bool:
    """Resumed by a validation that passed (during the validation the node is idle in its reservation)."""
    validated = ("validate", "resumed") in steps(engine, node)
    return validated and cluster.node_state(node) == "IDLE" and cluster.reason(node) is None


def history_cli(engine: Daemon, node: str) -> str:
    """What ``watchd node history`` prints of ``node``."""
    return subprocess.run(
        [*watchd_command(), "node", "history", node, "--url", engine.url],
        capture_output=True,
        text=True,
        env={"WATCHD_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"},
        check=True,
    ).stdout


def wait(
    cond: Callable[[], Any],
    timeout: float,
    what: str,
    cluster: SlurmCluster,
    node: str,
    engine: Daemon,
    agent: Daemon | None = None,
) -> None:
    """``wait_for``; on a timeout the node's actions, its Slurm state, its reboots and the daemons' logs."""
    try:
        wait_for(cond, timeout=timeout, what=what)
    except AssertionError as exc:
        state = cluster.run("scontrol", "show", "node", node, "-o", check=False).stdout
        done = [(a["action"], a["outcome"], a["detail"]) for a in actions(engine, node)]
        logs = f"engine:\n{engine.log()}" + (f"\nagent:\n{agent.log()}" if agent is not None else "")
        raise AssertionError(f"{exc}\n{done}\n{state}\n{cluster.reboot_events(node)}\n{logs}") from None


@contextlib.contextmanager
def rebooting_slurm() -> Iterator[SlurmCluster]:
    """A private cluster where watchd may reboot (``ReturnToService=1``; the session cluster runs 2, where
    watchd refuses): its RebootProgram plays a reboot in a few seconds. Fails under CI when Slurm is
    missing, skips elsewhere."""
    ok, why = slurm_available()
    if not ok:
        if real_components_required():
            pytest.fail(f"Slurm test cluster required but unavailable: {why}")
        pytest.skip(why)
    with SlurmCluster(real_nodes=2, return_to_service=1, reboot_timeout=60) as cluster:
        cluster.configure_reboots(delay=1.0, downtime=2.0)
        yield cluster
