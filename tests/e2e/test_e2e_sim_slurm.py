"""The fleet simulator against real processes on the real Slurm test cluster: `watchd sim` (10 nodes,
sim-1..sim-10, an uncorrectable ECC error on GPU 3 of sim-3) shipping to a `watchd engine` in enforce mode
with the shipped rule pack -> exactly sim-3 is drained in Slurm, with a watchd reason naming the GPU."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.daemons import Daemon, engine_config, free_port, watchd_command
from tests.harness.slurm import SlurmCluster
from tests.support import wait_for

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parent.parent.parent
TOKEN = "sim-e2e-token"
NODES = [f"sim-{i}" for i in range(1, 11)]
GPU3_PCI = "0000:5d:00"  # GPU 3 of the fake's HGX board (bus 0x5d)


@pytest.mark.real
def test_simulated_ecc_dbe_drains_exactly_that_node_in_slurm(sim: SlurmCluster, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    config = engine_config(free_port(), token, "enforce", str(sim.conf_path))
    config.update(rules=[str(ROOT / "rules")], state={"path": str(tmp_path / "engine.db")})
    engine = Daemon("engine", config, tmp_path)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        yaml.safe_dump(
            {
                "seed": 11,
                "nodes": {"count": 10, "name": "sim-{i}", "start": 1},
                "gpus": {"model": "H100-SXM", "count": 8},
                "interval_s": 1,
                "summary_window_s": 2,
                "faults": [{"node": "sim-3", "at": 3, "kind": "ecc_dbe", "gpu": 3}],
            }
        )
    )
    sim_log = tmp_path / "sim.out"
    proc: subprocess.Popen[bytes] | None = None
    try:
        engine.wait_ready()
        with open(sim_log, "wb") as log:
            proc = subprocess.Popen(
                [
                    *watchd_command(),
                    "sim",
                    str(fleet),
                    "--url",
                    engine.url,
                    "--token-file",
                    str(token),
                    "--duration",
                    "120",
                    "--progress",
                    "1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: "sim-3" in sim.drained("sim"), timeout=60, what="sim-3 drained")
        time.sleep(3.0)  # a wrong drain of another node would have happened by now
        assert sim.drained("sim") == {"sim-3"}
        reason = sim.reason("sim-3") or ""
        assert reason.startswith("watchd"), reason
        assert GPU3_PCI in reason, reason

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, sim_log.read_text()
        out = sim_log.read_text()
        assert "sim: stopped after" in out and "0 dropped" in out, out
        actions = engine.get_json("/api/v1/actions?limit=1000")["actions"]
        drained = {a["node"] for a in actions if a["action"] == "drain" and a["outcome"] == "drained"}
        assert drained == {"sim-3"}, actions
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        assert engine.stop() == 0, engine.log()
    assert set(NODES).isdisjoint(sim.drained("sim") - {"sim-3"})
