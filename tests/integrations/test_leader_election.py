"""Leader election through a Lease: one leader at a time, take-over only after the lease expired, and with
two real ``watchd engine`` processes no action done twice."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.daemons import Daemon, free_port
from tests.harness.kube_api import KubeApiServer, in_thread
from tests.support import wait_for, xid_event
from watchd.actions.audit import MemoryAudit
from watchd.actions.executor import ActionExecutor
from watchd.clock import SystemClock
from watchd.engine.metrics import EngineMetrics
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.integrations.kubernetes.client import make_client
from watchd.integrations.kubernetes.lease import LeaseElector
from watchd.model.events import INGEST_PATH, Event, batch_to_wire
from watchd.rules import Decision, PlannedAction

LEASE = ("watchd", "watchd-engine")


@pytest.fixture
async def api() -> AsyncIterator[KubeApiServer]:
    async with KubeApiServer() as server:
        yield server


def elector(api: KubeApiServer, tmp_path: Path, identity: str) -> LeaseElector:
    kc = tmp_path / f"kc-{identity}"
    kc.write_text(yaml.safe_dump(api.kubeconfig()))
    return LeaseElector(
        make_client(kc, in_cluster=False),
        namespace=LEASE[0],
        name=LEASE[1],
        identity=identity,
        lease_duration_s=2.0,
        renew_deadline_s=1.5,
        retry_period_s=0.2,
    )


def holder(api: KubeApiServer) -> str | None:
    lease = api.state.leases.get(LEASE)
    return lease["spec"].get("holderIdentity") if lease else None


async def test_one_leader_takeover_after_expiry_and_release(api: KubeApiServer, tmp_path: Path) -> None:
    a, b = elector(api, tmp_path, "a"), elector(api, tmp_path, "b")
    a.start()
    assert await a.wait_leader(3)
    b.start()
    await asyncio.sleep(1.0)
    assert a.is_leader and not b.is_leader and holder(api) == "a"
    # a crashes (no release): b takes over only once a's last renewal is a lease duration old
    assert a._task is not None
    a._task.cancel()
    crashed = time.monotonic()
    assert await b.wait_leader(5)
    waited = time.monotonic() - crashed
    assert 1.6 <= waited <= 3.5, waited
    assert holder(api) == "b" and api.state.leases[LEASE]["spec"]["leaseTransitions"] == 1
    # a comes back: it sees b renewing and follows
    a._task = None
    a.is_leader = False
    a._leading.clear()
    a.start()
    await asyncio.sleep(0.8)
    assert not a.is_leader and b.is_leader
    # a clean stop releases the lease: a takes over within a few retry periods, not a lease duration
    released = time.monotonic()
    await b.stop()
    assert holder(api) == ""
    assert await a.wait_leader(3)
    assert time.monotonic() - released < 1.2
    await a.stop()
    await a.client.close()
    await b.client.close()


async def test_leader_steps_down_when_it_cannot_renew(api: KubeApiServer, tmp_path: Path) -> None:
    a = elector(api, tmp_path, "a")
    a.start()
    assert await a.wait_leader(3)
    api.inject(503, path="/leases/", times=1000)
    t0 = time.monotonic()
    for _ in range(100):
        if not a.is_leader:
            break
        await asyncio.sleep(0.05)
    # steps down after renew_deadline (1.5 s), before its lease (2 s) could expire elsewhere
    assert not a.is_leader and 1.3 <= time.monotonic() - t0 < 2.0
    assert "503" in a.last_error
    api.injected.clear()
    await a.stop()
    await a.client.close()


async def test_the_executor_acts_only_while_leading(api: KubeApiServer, tmp_path: Path) -> None:
    """The elector is the executor's leadership gate: a follower's drain fails naming the leader and touches
    nothing (reads go through); once it leads, the same drain is carried out."""
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1"])
    a, b = elector(api, tmp_path, "a"), elector(api, tmp_path, "b")
    a.start()
    assert await a.wait_leader(3)
    b.takeover_wait_s = 0.5
    b.start()  # the executor does not campaign: its owner (the engine) starts and stops the elector
    audit = MemoryAudit()
    executor = ActionExecutor(fake, "enforce", SystemClock(), EngineMetrics(), audit, leadership=b)
    drain = PlannedAction("drain", "gpu-1", {"reason": "Xid 79"})
    async with executor:
        executor.submit(_decision(drain, "e1"), 0.0)
        await executor.drain_in_flight(5)
        assert audit.entries[-1].outcome == "failed"
        assert re.search(r"not the leader .*held by a", audit.entries[-1].detail)
        assert fake.calls_of("drain") == []
        assert (await fake.node_states(["gpu-1"]))["gpu-1"].name == "gpu-1"  # reads go through
        await a.stop()
        b.takeover_wait_s = 5
        executor.submit(_decision(drain, "e2"), 0.0)
        await executor.drain_in_flight(10)
        assert audit.entries[-1].outcome == "drained"
    await b.stop()
    await a.client.close()


def _decision(action: PlannedAction, event_id: str) -> Decision:
    return Decision(
        rule="fatal-xid",
        severity="critical",
        event=xid_event("gpu-1", event_id=event_id),
        actions=(action,),
        labels={},
        group={"node": "gpu-1"},
    )


# ------------------------------------------------------------------------------------- two real engines
RULES = """
rules:
  - name: fatal-xid
    severity: critical
    match: {kind: xid, xid: 79}
    actions:
      - drain: {reason: "Xid {{ xid }} GPU {{ pci_bus_id }}"}
"""


def post(engine: Daemon, node: str, event_id: str) -> int:
    event = Event(
        id=event_id,
        node=node,
        source="kmsg",
        kind="xid",
        time=time.time(),
        attrs={"xid": 79, "pci_bus_id": "0000:3b:00.0"},
    )
    req = urllib.request.Request(
        f"{engine.url}{INGEST_PATH}",
        data=json.dumps(batch_to_wire(node, [event])).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(resp.status)


def ready(engine: Daemon) -> int:
    try:
        with urllib.request.urlopen(f"{engine.url}/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def leader_metric(engine: Daemon) -> float:
    [line] = [x for x in engine.get("/metrics").splitlines() if x.startswith("watchd_leader ")]
    return float(line.split()[1])


def start_engine(tmp: Path, api: KubeApiServer, name: str) -> Daemon:
    kc = tmp / f"kubeconfig-{name}"
    kc.write_text(yaml.safe_dump(api.kubeconfig(token=f"token-{name}")))
    rules = tmp / "rules.yaml"
    rules.write_text(RULES)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "mode": "enforce",
        "rules": [str(rules)],
        "default_rules": False,
        "slurm": {"enabled": False},
        "kubernetes": {
            "enabled": True,
            "kubeconfig": str(kc),
            "eviction": {"deadline_s": 1},
            "leader_election": {
                "enabled": True,
                "identity": name,
                "lease_duration_s": 3,
                "renew_deadline_s": 2,
                "retry_period_s": 0.25,
            },
        },
        "state": {"path": str(tmp / f"state-{name}.db")},
        "log": {"format": "json"},
    }
    engine = Daemon("engine", config, tmp)
    engine.wait_ready()
    return engine


def node_writes(api: KubeApiServer, node: str, user: str | None = None) -> list[float]:
    return [
        c.at
        for c in api.calls
        if c.verb == "patch"
        and c.path == f"/api/v1/nodes/{node}"
        and c.status == 200
        and (user is None or c.user == user)
    ]


@pytest.mark.real
def test_two_engines_fail_over_without_acting_twice(tmp_path: Path) -> None:
    with in_thread(tokens={"token-engine-a": "engine-a", "token-engine-b": "engine-b"}) as api:
        for i in range(1, 4):
            api.add_node(f"gpu-{i}")
        a = start_engine(tmp_path, api, "engine-a")
        wait_for(lambda: ready(a) == 200, 10, "engine-a leading")
        b = start_engine(tmp_path, api, "engine-b")
        try:
            time.sleep(1.0)
            assert ready(b) == 503 and holder(api) == "engine-a"
            assert leader_metric(a) == 1 and leader_metric(b) == 0
            assert post(a, "gpu-1", "x1") == 200
            wait_for(
                lambda: api.node("gpu-1")["spec"].get("unschedulable"), 10, "gpu-1 cordoned by the leader"
            )
            # the follower is told about gpu-2 while the leader still holds the lease; then the leader dies
            assert post(b, "gpu-2", "x2") == 200
            time.sleep(0.5)
            assert not node_writes(api, "gpu-2"), "the follower acted while the lease was held"
            a.proc.kill()
            a.proc.wait()
            killed = time.time()
            last_renewal = max(
                c.at
                for c in api.calls
                if c.resource == "leases" and c.verb == "update" and c.status == 200 and c.user == "engine-a"
            )
            wait_for(lambda: node_writes(api, "gpu-2"), 15, "gpu-2 cordoned by the new leader")
            took_over = node_writes(api, "gpu-2", "engine-b")[0]
            assert took_over >= last_renewal + 3.0 - 0.3, took_over - last_renewal
            assert took_over - killed < 3.0 + 2.0
            assert api.node("gpu-2")["spec"]["unschedulable"] is True
            wait_for(lambda: ready(b) == 200, 5, "engine-b ready as the leader")
            assert leader_metric(b) == 1
            # gpu-1's fault reported again to the new leader: already drained, nothing written
            assert post(b, "gpu-1", "x1-again") == 200
            wait_for(
                lambda: any(x["node"] == "gpu-1" for x in b.get_json("/api/v1/actions?limit=50")["actions"]),
                10,
                "engine-b decided on gpu-1",
            )
            time.sleep(0.5)
            assert not node_writes(api, "gpu-1", "engine-b")
            outcomes = {(x["node"], x["outcome"]) for x in b.get_json("/api/v1/actions?limit=50")["actions"]}
            assert ("gpu-1", "already_drained") in outcomes and ("gpu-2", "drained") in outcomes
            assert api.state.leases[LEASE]["spec"]["holderIdentity"] == "engine-b"
        finally:
            b.stop()
            a.stop()
        assert holder(api) == ""  # b released the lease on its clean stop
