"""End to end with real processes: training ranks report through `watchd.client.Heartbeat` to the Unix sockets
of two real `watchd agent` processes (fake GPUs under training load, no process-to-job mapping, no
scheduler); the agents forward to a real `watchd engine` whose detectors judge three jobs at once:

* a healthy one: nothing;
* one whose ranks stop with rank 3's collective behind the others: an ``nccl_hang`` from heartbeats alone,
  naming rank 3's node and GPU, well before NVML could see it (the fake GPUs still look busy);
* one that pauses in a declared checkpoint longer than the stall threshold, then trains on: nothing.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon, agent_config, engine_config, free_port
from tests.support import wait_for
from watchd.client import Heartbeat

pytestmark = pytest.mark.real

SCENARIO = Path(__file__).resolve().parent.parent / "gpu_scenarios" / "healthy_training.yaml"
FINDINGS_RULES = Path(__file__).resolve().parent.parent.parent / "rules" / "findings.yaml"
STEP_S = 0.25
NODES = ("hb-node-a", "hb-node-b")


class Rank:
    """One training rank in a thread: a step every STEP_S, driven by ``plan(step) -> action``."""

    def __init__(self, job: str, rank: int, gpu: int, socket: Path, plan: Callable[[int], str]) -> None:
        self.hb = Heartbeat(job, rank, gpu=gpu, socket_path=str(socket), report_done_at_exit=False)
        self.plan = plan
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        step = 0
        while not self.stop.is_set():
            action = self.plan(step + 1)
            if action == "hang":  # blocked in a collective: no more reports
                self.stop.wait()
                return
            if action == "checkpoint":
                with self.hb.phase("checkpoint"):
                    self.stop.wait(14.0)  # longer than the 10 s stall threshold
                self.stop.wait(3.0)  # the first step after it is slow (the data loader restarts)
            step += 1
            self.hb.step(step, collective_seq=step)
            self.stop.wait(STEP_S)


def healthy(step: int) -> str:
    return "step"


def hang_after(steps: int, lagging: bool) -> Callable[[int], str]:
    # every rank finishes `steps`; the others finish one more step, the lagging one never does
    return lambda step: "hang" if step > steps + (0 if lagging else 1) else "step"


def checkpoint_at(steps: int) -> Callable[[int], str]:
    return lambda step: "checkpoint" if step == steps else "step"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Daemon, dict[str, Path]]]:
    token = tmp_path / "token"
    token.write_text("hb-e2e\n")
    config = engine_config(free_port(), token, "dry-run", None)
    config.update(rules=[str(FINDINGS_RULES)], default_rules=False, detectors={"interval_s": 1.0})
    engine = Daemon("engine", config, tmp_path)
    daemons = [engine]
    sockets = {}
    short = Path(tempfile.mkdtemp(prefix="watchd-hb-"))  # a Unix socket path must stay under 108 bytes
    try:
        engine.wait_ready()
        for node in NODES:
            cfg = agent_config(node, engine.port, token, tmp_path / f"{node}.log")
            cfg["sources"] = {
                "kmsg": {"enabled": False},
                "gpu": {"backend": "fake", "scenario": str(SCENARIO), "interval_s": 1.0},
            }
            sockets[node] = short / node / "heartbeat.sock"
            # on by default: only where it listens and how often it forwards are set here
            # the ranks are threads of this test, in no job's cgroup (verification: tests/security/)
            cfg["heartbeat"] = {
                "socket": str(sockets[node]),
                "http_port": 0,
                "forward_interval_s": 0.5,
                "verify": False,
            }
            agent = Daemon("agent", cfg, tmp_path)
            daemons.append(agent)
            agent.wait_ready()
        yield engine, sockets
    finally:
        for d in reversed(daemons):
            d.stop()
        shutil.rmtree(short, ignore_errors=True)


def findings(engine: Daemon) -> list[dict[str, Any]]:
    return list(engine.get_json("/api/v1/status")["findings"])


def test_heartbeats_find_the_hang_name_the_lagging_rank_and_respect_a_checkpoint(
    fleet: tuple[Daemon, dict[str, Path]],
) -> None:
    engine, sockets = fleet
    ranks: list[Rank] = []
    for job, plan_of in (
        ("hb-healthy", lambda rank: healthy),
        ("hb-hang", lambda rank: hang_after(24, lagging=rank == 3)),
        ("hb-checkpoint", lambda rank: checkpoint_at(16)),
    ):
        base = {"hb-healthy": 0, "hb-hang": 2, "hb-checkpoint": 4}[job]
        for rank in range(4):  # ranks 0-1 on node a, 2-3 on node b, each job on its own two GPUs a node
            node = NODES[rank // 2]
            ranks.append(Rank(job, rank, base + rank % 2, sockets[node], plan_of(rank)))
    started = time.monotonic()
    for r in ranks:
        r.thread.start()
    try:
        # hb-hang stops after ~6 s of steps: a finding once its ranks are 10 s stalled
        wait_for(lambda: any(f["kind"] == "nccl_hang" for f in findings(engine)), 40, "the hang found")
        hang_found_after = time.monotonic() - started
        # the checkpoint (~4 s to ~18 s, next step at ~21 s) is over and training resumed
        while time.monotonic() - started < 26.0:
            time.sleep(0.5)
        found = findings(engine)
        status = engine.get_json("/api/v1/status")
    finally:
        for r in ranks:
            r.stop.set()
        for r in ranks:
            r.thread.join(5)
            r.hb.close(timeout=10.0)  # the last reports sent even on a loaded machine (1 s by default)
    kinds = [(f["kind"], f["attrs"]["job"]) for f in found]
    assert kinds == [("nccl_hang", "hb-hang")], [f["attrs"] for f in found]
    hang = found[0]["attrs"]
    assert (hang["culprit_node"], hang["culprit_gpu"], hang["evidence"]) == ("hb-node-b", 3, "heartbeat_lag")
    assert hang["signal"] == "heartbeat"
    assert 16.0 <= hang_found_after <= 30.0, hang_found_after  # 6 s of steps + 10 s stall + forwarding
    assert status["jobs"] == 3  # the engine knows the three jobs from their heartbeats alone
    for r in ranks:
        assert r.hb.dropped == 0, (r.hb.job, r.hb.rank, r.hb.dropped)
