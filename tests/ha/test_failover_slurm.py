"""Two real engines on a real PostgreSQL acting on the real Slurm test cluster (issue 22).

- kill -9 of the leader in the middle of a burst, three rounds: the follower takes over; every event is
  acted on (0 lost) and no node is drained twice (slurmctld's own log counts each drain it performed); the
  blast-radius breaker's window spans the failovers (never more than ``max_nodes`` drained in all, the rest
  held); rule memory survives (a count begun on one leader completes on the next); a new fault on a node
  the dead leader drained is de-duplicated by its cooldown; and after a quiet failover the new leader shows
  the holds, the breaker window and the breaker alert (re-fired at takeover to a real Alertmanager).
- A leader paused with SIGSTOP past its lease, then resumed, cannot act: a batch it finds on resuming is
  refused (503, never 200), nothing of it is written and Slurm is not touched; the new leader acts on it.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.ha.pair import HaPair, xid
from tests.harness.alertmanager import AlertmanagerProcess
from tests.harness.postgres import PostgresServer
from tests.harness.slurm import SlurmCluster
from tests.support import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.real]

MAX_NODES = 6
BREAKER_ALERT = "WatchdBlastRadiusBreakerOpen"


def drains_logged(cluster: SlurmCluster, since: int) -> Counter[str]:
    """Per node, the drains slurmctld performed (its own log) after byte offset ``since``."""
    assert cluster.dir is not None
    text = (cluster.dir / "log" / "slurmctld.log").read_bytes()[since:].decode(errors="replace")
    return Counter(re.findall(r"update_node: node (\S+) state set to DRAINED", text))


def log_size(cluster: SlurmCluster) -> int:
    assert cluster.dir is not None
    return (cluster.dir / "log" / "slurmctld.log").stat().st_size


def held_nodes(pair: HaPair) -> set[str]:
    return {r[0] for r in pair.rows("SELECT node FROM held WHERE status = 'held'")}


def other(name: str) -> str:
    return "b" if name == "a" else "a"


def test_kill9_of_the_leader_mid_burst_loses_and_repeats_nothing(
    sim: SlurmCluster, pg_server: PostgresServer, alertmanager: AlertmanagerProcess, tmp_path: Path
) -> None:
    since = log_size(sim)
    pair = HaPair(
        pg_server,
        tmp_path,
        slurm_conf=str(sim.conf_path),
        extra={
            "safety": {
                "max_fraction": 1.0,
                "max_nodes": MAX_NODES,
                "window_s": 3600,
                "pools_refresh_s": 3600,
            },
            "alertmanager": {"urls": [alertmanager.url], "resend_interval_s": 3600},
        },
    )
    try:
        a = pair.start("a")
        assert pair.leader()[0] == "a"
        pair.start("b")
        # rule memory: the first of two application Xids on sim-50 reaches leader a, which is then killed;
        # the second reaches b, which completes the count a began
        assert pair.deliver([xid("sim-50", 13)]) == "a"
        wait_for(
            lambda: pair.rows("SELECT 1 FROM rule_state WHERE rule = 'app-xid-twice'") != [],
            timeout=10,
            what="rule state saved",
        )
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        assert pair.deliver([xid("sim-50", 13)]) == "b"
        wait_for(lambda: "sim-50" in sim.drained("sim"), timeout=20, what="sim-50 drained")
        pair.restart("a")
        burst_nodes: list[str] = []
        for round_ in range(3):
            name, leader = pair.leader()
            nodes = [f"sim-{10 * round_ + i}" for i in range(1, 7)]
            burst_nodes += nodes
            first, second = nodes[:3], nodes[3:]
            senders = [threading.Thread(target=pair.deliver, args=([xid(n)],)) for n in first]
            for t in senders:
                t.start()
            # mid-burst: once the first action of the round is recorded, kill -9 the leader
            wait_for(
                lambda nodes=first: bool(set(nodes) & (sim.drained("sim") | held_nodes(pair))),
                timeout=20,
                what="the burst begun",
            )
            leader.proc.send_signal(signal.SIGKILL)
            leader.proc.wait()
            later = [threading.Thread(target=pair.deliver, args=([xid(n)],)) for n in second]
            for t in later:
                t.start()
            for t in senders + later:
                t.join(90)
            new_name, _ = pair.leader()
            assert new_name == other(name)
            if round_ == 0:
                # cooldowns: a new fatal Xid on a node the dead leader drained is de-duplicated by the
                # cooldown it recorded (without it, the outcome would be already_drained)
                wait_for(
                    lambda nodes=first: sim.drained("sim") & set(nodes),
                    timeout=20,
                    what="a drain of the round",
                )
                again = xid(sorted(sim.drained("sim") & set(first))[0])
                pair.deliver([again])
                outcome = pair.rows("SELECT outcome FROM audit WHERE event_id = %s", (again.id,))
                assert outcome == [("deduplicated",)], outcome
            # 0 lost: every node of the burst is drained or held
            wait_for(
                lambda nodes=list(burst_nodes): set(nodes) <= sim.drained("sim") | held_nodes(pair),
                timeout=30,
                what="every event of the burst acted on",
            )
            pair.restart(name)  # the killed engine comes back as the follower
        time.sleep(1.0)  # a late, wrong action would have happened by now
        drained = sim.drained("sim")
        held = held_nodes(pair)
        counted = drains_logged(sim, since)
        # 0 double actions: slurmctld drained no node twice; the breaker's window spanned the failovers
        twice = [n for n, c in counted.items() if c > 1]
        audit = pair.rows("SELECT time, event_id, node, action, outcome, detail FROM audit ORDER BY id")
        assert not twice, "\n".join(map(str, audit))
        assert len(set(counted)) == MAX_NODES, counted
        assert "sim-50" in counted
        assert drained.isdisjoint(held)
        assert set(burst_nodes) <= set(counted) | held, (set(burst_nodes), counted, held)
        assert len(held) == len(set(burst_nodes) | {"sim-50"}) - MAX_NODES

        # a quiet failover: the new leader shows holds, the breaker window and the breaker alert it re-fired
        name, leader = pair.leader()
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait()
        _, successor = pair.leader()
        status = successor.get_json("/api/v1/status")
        assert {h["node"] for h in status["held"]} == held
        assert sum(p["taken_out_count"] for p in status["breaker"]) >= MAX_NODES
        wait_for(
            lambda: BREAKER_ALERT in str(successor.get_json("/api/v1/status")["alerts"]),
            timeout=10,
            what="the breaker alert re-fired by the new leader",
        )
        assert drains_logged(sim, since) == counted
    finally:
        pair.stop()


def test_a_leader_paused_past_its_lease_cannot_act_or_write(
    sim: SlurmCluster, pg_server: PostgresServer, tmp_path: Path
) -> None:
    since = log_size(sim)
    pair = HaPair(pg_server, tmp_path, slurm_conf=str(sim.conf_path), lease_s=2.0)
    try:
        a = pair.start("a")
        assert pair.leader()[0] == "a"
        b = pair.start("b")
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: pair.ready(b), timeout=20, what="b takes over")
            # a batch reaches the paused engine (the kernel accepts the connection; a reads it on waking)
            result: list[int] = []
            sender = threading.Thread(target=lambda: result.append(pair.post(a, [xid("sim-77")], timeout=30)))
            sender.start()
            time.sleep(0.5)
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        sender.join(40)
        assert result and result[0] == 503, (result, a.log())
        time.sleep(1.0)
        assert "sim-77" not in sim.drained("sim")
        assert drains_logged(sim, since)["sim-77"] == 0
        assert pair.rows("SELECT key FROM intents WHERE node = 'sim-77'") == []
        assert pair.rows("SELECT id FROM audit WHERE node = 'sim-77'") == []
        assert not pair.ready(a)
        # the agent sends it again: the leader acts, once
        assert pair.deliver([xid("sim-77")]) == "b"
        wait_for(lambda: "sim-77" in sim.drained("sim"), timeout=20, what="sim-77 drained by b")
        assert drains_logged(sim, since)["sim-77"] == 1
    finally:
        pair.stop()
