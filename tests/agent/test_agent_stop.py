"""A real ``watchd agent`` stopped (SIGTERM, as systemd does) while it follows a Slurm job's output that is
being written, with the engine killed at that very moment: the agent exits within its bound every time, well
under the unit's TimeoutStopSec, and the events it still held are in its spool, delivered once an engine is
back. A follower waiting on its folder used to keep the cancellation of the stop to itself (asyncio.wait_for
of Python 3.11 when the folder changed in the same turn): the agent ran on until systemd's SIGKILL, its
queue lost."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from tests.daemons import Daemon, agent_config
from tests.fault.common import start_engine
from tests.harness.slurm import SlurmCluster
from tests.support import wait_for

pytestmark = [pytest.mark.real, pytest.mark.slurm]

NODE = "gpu-3"
UNIT = Path(__file__).resolve().parents[2] / "systemd" / "watchd-agent.service"
STOPS = 20
FLUSH_S = 0.5
#: the agent's own bound: the flush, its sources' and shipper's stop (2 s each at most), the HTTP cleanup
BOUND_S = 8.0
NCCL = (
    "transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.35.1<49189> with error 4, "
    "opcode 5327, len 5327, vendor err 81 (Send)"
)


def _received(engine: Daemon) -> float:
    total = 0.0
    for line in engine.get("/metrics").splitlines():
        if line.startswith("watchd_events_received_total{") and 'kind="nccl_warn"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _spooled(log: str) -> int:
    """The events the agent said it spooled at its stop (its last word on it)."""
    counts = [json.loads(line)["count"] for line in log.splitlines() if '"events_spooled"' in line]
    return counts[-1] if counts else 0


def test_twenty_stops_with_the_engine_killed_none_hangs_and_the_queue_is_spooled(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    timeout_stop = int(re.search(r"^TimeoutStopSec=(\d+)", UNIT.read_text(), re.M).group(1))  # type: ignore[union-attr]
    assert timeout_stop / 2 > BOUND_S
    cluster = slurm_cluster
    cluster.reset_nodes([NODE])
    # a job printing NCCL warnings all the time: its output file changes in every turn of the agent's loop
    job = cluster.submit(
        f'i=0; while :; do i=$((i+1)); echo "{NODE}:$$:$$ [0] {NCCL} n=$i"; sleep 0.002; done',
        nodes=1,
        extra_args=["-w", NODE],
    )
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    spool = tmp_path / f"{NODE}-spool.jsonl"
    spooled_total = 0
    try:
        cluster.wait_job_running(job)
        for attempt in range(STOPS):
            engine = start_engine(tmp_path)
            config = agent_config(NODE, engine.port, tmp_path / "token", kernel_log)
            config["shipper"]["shutdown_flush_s"] = FLUSH_S
            config["sources"]["training"] = {
                "slurm_jobs": True,
                "slurm_node": NODE,
                "slurm_conf": str(cluster.conf_path),
                "slurm_poll_s": 0.2,
                "max_events_per_minute": 1_000_000,
            }
            agent = Daemon("agent", config, tmp_path)
            try:
                agent.wait_ready()
                # the job's lines reach the engine, and what the last stop spooled was delivered
                wait_for(lambda: _received(engine) > 0, timeout=20, what="the job's lines at the engine")  # noqa: B023
                wait_for(lambda: not spool.exists(), timeout=20, what="the last stop's spool delivered")
                engine.proc.send_signal(signal.SIGKILL)
                agent.proc.send_signal(signal.SIGTERM)
                started = time.monotonic()
                try:
                    code = agent.proc.wait(BOUND_S)
                except Exception:
                    pytest.fail(f"stop {attempt}: still running {BOUND_S} s after SIGTERM:\n{agent.log()}")
                took = time.monotonic() - started
                assert code == 0, f"stop {attempt}: exit {code} after {took:.1f} s"
                spooled = _spooled(agent.log_path.read_text())
                print(f"stop {attempt}: exited in {took:.2f} s, {spooled} events spooled")
                held = spool.read_text().splitlines() if spool.exists() else []
                assert len(held) == spooled, f"stop {attempt}: {spooled} spooled, {len(held)} in the file"
                assert "events_undelivered_at_shutdown" not in agent.log_path.read_text()
                spooled_total += spooled
            finally:
                agent.stop()
                engine.stop()
        assert spooled_total > 0, "no stop had events queued: the test did not test the spool"
    finally:
        cluster.cancel(job)

    # the job is gone: the last spool alone reaches a new engine, every event of it, once
    last = [json.loads(line)["id"] for line in spool.read_text().splitlines()] if spool.exists() else []
    engine = start_engine(tmp_path)
    agent = Daemon("agent", agent_config(NODE, engine.port, tmp_path / "token", kernel_log), tmp_path)
    try:
        agent.wait_ready()
        wait_for(lambda: not spool.exists(), timeout=20, what="the spool delivered")
        assert _received(engine) == len(set(last))
    finally:
        agent.stop()
        engine.stop()
