"""Safety and durability with real processes: `watchd engine` on the real Slurm test cluster with a real
Alertmanager. A burst beyond the blast-radius breaker is held (and listed, and alerted); a `kill -9` of the
engine mid-burst neither drains a node twice nor loses a decided action."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon, engine_config, free_port, watchd_command
from tests.harness.alertmanager import AlertmanagerProcess
from tests.harness.slurm import SlurmCluster
from tests.support import wait_for
from watchd.model.events import INGEST_PATH, Event, batch_to_wire
from watchd.store.database import Store

pytestmark = pytest.mark.slurm

TOKEN = "safety-token"

RULES = """
rules:
  - name: fatal-xid
    severity: critical
    match: {kind: xid, xid: 79}
    actions:
      - drain: {reason: "Xid {{ xid }} GPU {{ pci_bus_id }}"}
      - requeue
      - alert: {summary: "Xid {{ xid }} on {{ node }}"}
"""


def post(engine: Daemon, node: str, event_id: str) -> int:
    event = Event(
        id=event_id,
        node=node,
        source="kmsg",
        kind="xid",
        time=time.time(),
        attrs={"xid": 79, "pci_bus_id": "0000:3b:00.0", "meaning": "GPU has fallen off the bus"},
    )
    body = json.dumps(batch_to_wire(node, [event])).encode()
    request = urllib.request.Request(
        f"{engine.url}{INGEST_PATH}",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status)


def start_engine(tmp: Path, cluster: SlurmCluster, db: Path, **extra: Any) -> Daemon:
    token = tmp / "token"
    token.write_text(TOKEN)
    rules = tmp / "rules.yaml"
    rules.write_text(RULES)
    config = engine_config(free_port(), token, "enforce", str(cluster.conf_path))
    config.update(rules=[str(rules)], default_rules=False, state={"path": str(db)}, **extra)
    engine = Daemon("engine", config, tmp)
    engine.wait_ready()
    return engine


@pytest.mark.real
def test_burst_beyond_the_breaker_is_held_listed_and_alerted(
    sim: SlurmCluster, alertmanager: AlertmanagerProcess, tmp_path: Path
) -> None:
    # sim partition: 200 nodes; 10% -> at most 20 taken out by watchd within the window
    engine = start_engine(
        tmp_path,
        sim,
        tmp_path / "engine.db",
        alertmanager={"urls": [alertmanager.url], "resend_interval_s": 5},
        safety={"max_fraction": 0.1, "max_nodes": 50, "window_s": 3600},
    )
    try:
        nodes = sim.sim_node_names[:30]
        for i, node in enumerate(nodes):
            assert post(engine, node, f"burst-{i}") == 200
        wait_for(lambda: len(engine.get_json("/api/v1/held")["held"]) == 10, what="10 held actions")
        assert len(sim.drained("sim")) == 20
        held = engine.get_json("/api/v1/held")["held"]
        assert all("blast-radius breaker" in h["reason"] and h["pool"] == "sim" for h in held)

        cli = [*watchd_command(), "actions"]
        env = {**os.environ, "WATCHD_TOKEN": TOKEN}  # reads need a credential where the engine has one
        listing = subprocess.run(
            [*cli, "list", "--url", engine.url], capture_output=True, text=True, check=True, env=env
        )
        assert listing.stdout.count("blast-radius breaker") == 10
        assert (
            listing.stdout.count("evidence: xid at ") == 10
            and "xid=79 pci_bus_id=0000:3b:00.0" in listing.stdout
        )
        status = subprocess.run(
            [*watchd_command(), "status", "--url", engine.url],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        assert "sim              20/20 of 200 nodes" in status.stdout

        # detection and alerting go on: the breaker alert and the held nodes' own alerts reach Alertmanager
        wait_for(lambda: alertmanager.alert("WatchdBlastRadiusBreakerOpen"), what="breaker alert")
        wait_for(
            lambda: len(alertmanager.alerts(filter=['alertname="fatal-xid"'])) == 30, what="30 node alerts"
        )

        # an operator releases one held drain and discards another
        first, second = held[0]["id"], held[1]["id"]
        released = subprocess.run(
            [*cli, "release", str(first), "--url", engine.url, "--by", "alice"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert released.returncode == 0 and "drained" in released.stdout, released.stdout + released.stderr
        assert held[0]["node"] in sim.drained("sim")
        discarded = subprocess.run(
            [*cli, "discard", str(second), "--url", engine.url],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert discarded.returncode == 0 and "discarded" in discarded.stdout
        unauthorized = subprocess.run(
            [*cli, "discard", str(held[2]["id"]), "--url", engine.url],
            capture_output=True,
            text=True,
            check=False,
        )
        assert unauthorized.returncode == 4 and "401" in unauthorized.stderr  # refused: 4
        assert len(engine.get_json("/api/v1/held")["held"]) == 8
    finally:
        assert engine.stop() == 0, engine.log()


@pytest.mark.real
def test_kill_9_mid_burst_neither_repeats_nor_loses_an_action(sim: SlurmCluster, tmp_path: Path) -> None:
    db = tmp_path / "engine.db"
    limits = {"safety": {"max_fraction": 1.0, "max_nodes": 1000, "window_s": 3600}}
    engine = start_engine(tmp_path, sim, db, **limits)
    nodes = sim.sim_node_names[:40]
    accepted = []
    for i, node in enumerate(nodes):
        if post(engine, node, f"kill-{i}") == 200:
            accepted.append(node)
        if i == 20:
            wait_for(lambda: sim.drained("sim"), what="the first drains")
            engine.proc.send_signal(signal.SIGKILL)
            engine.proc.wait()
            break
    # the agents re-send only what was not acknowledged: a 200 means the engine has evaluated the event
    # and recorded its drain, so nothing acknowledged may depend on being sent again
    engine = start_engine(tmp_path, sim, db, **limits)
    try:
        wait_for(lambda: sim.drained("sim") >= set(accepted), what="every acknowledged node drained")
        for i, node in enumerate(nodes):
            if node not in accepted:
                assert post(engine, node, f"kill-{i}") == 200
        wait_for(lambda: sim.drained("sim") >= set(nodes), what="every node drained")
        wait_for(lambda: not _unfinished(db), what="no unfinished intents")
    finally:
        assert engine.stop() == 0, engine.log()
    with Store.open(db) as store:
        store.check()
        drains = [a for a in store.audit.recent(10_000) if a.action == "drain"]
        intents = {node: store.intents.under(f"drain:{node}") for node in nodes}
    done = [a.node for a in drains if a.outcome == "drained"]
    assert sorted(done) == sorted(set(done)), "a node was drained twice"
    for node in accepted:  # every decision taken before the kill was carried out exactly once
        outcomes = [i.outcome for i in intents[node]]
        assert outcomes and None not in outcomes, (node, outcomes)
        # drained once; an intent cut short by the kill is re-driven and finds the node already drained
        assert outcomes.count("drained") <= 1, (node, outcomes)
        assert {"drained", "already_drained"} & set(outcomes), (node, outcomes)


def _unfinished(db: Path) -> list[Any]:
    with Store.open(db) as store:
        return store.intents.unfinished()
