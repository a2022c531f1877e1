"""What an admin sees of watchd's drains in plain ``sinfo -R`` (20 characters of a reason): a real
``watchd engine`` with the default rule pack, enforcing on the real test cluster, drains one simulated node
per kind of drain the pack makes (an event for each, over HTTP as the agents send them); the default
``sinfo -R`` then tells every one apart, and ``scontrol show node`` and the audit keep the whole reason.

Kinds left out here, each tested elsewhere with its reason's first 20 characters: the IB port rules hold
for 2 minutes (rules/tests/ib.yaml), the lemon rule needs a second drain within 28 days
(rules/tests/lemon.yaml), a validation needs the checks' jobs (tests/checks/test_slurm_checks.py)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon, engine_config, free_port
from tests.harness.slurm import SlurmCluster
from tests.support import wait_for
from watchd.model.events import INGEST_PATH, Event, batch_to_wire

pytestmark = pytest.mark.slurm

TOKEN = "sinfo-token"
GPU = {"gpu": 3, "uuid": "GPU-8f6b2c1e", "pci_bus_id": "0000:3b:00.0"}
FINDING = {"job": "slurm:42", "summary": "job slurm:42", "confidence": 0.9}

#: node -> (kind, attrs, what the 20 characters of sinfo -R show)
DRAINS: dict[str, tuple[str, dict[str, Any], str]] = {
    "sim-1": (
        "xid",
        {
            "xid": 79,
            "pci_bus_id": "0000:3b:00.0",
            "bucket": "RESTART_BM",
            "meaning": "GPU has fallen off the bus",
        },
        "watchd: Xid79 3b:00 ",
    ),
    "sim-2": (
        "xid",
        {
            "xid": 48,
            "pci_bus_id": "0000:5d:00.0",
            "bucket": "WORKFLOW_XID_48",
            "meaning": "double-bit ECC error",
        },
        "watchd: Xid48 5d:00 ",
    ),
    "sim-3": (
        "xid",
        {"xid": 154, "pci_bus_id": "0000:3b:00.0", "recovery_action": "NODE_REBOOT"},
        "watchd: Xid154 3b:00",
    ),
    "sim-4": (
        "gpu_health",
        {**GPU, "condition": "ecc_dbe", "value": 2, "threshold": 0, "evidence": "volatile DBE count 2"},
        "watchd: GPU3 ECC DBE",
    ),
    "sim-5": (
        "gpu_health",
        {**GPU, "condition": "gpu_lost", "value": 1, "evidence": "GPU is lost"},
        "watchd: GPU3 lost (N",
    ),
    "sim-6": (
        "gpu_health",
        {**GPU, "condition": "pcie_downtrain", "value": 1, "evidence": "PCIe Gen5 x8, expected x16"},
        "watchd: GPU3 PCIe: P",
    ),
    "sim-7": (
        "nccl_hang",
        {
            **FINDING,
            "hardware": True,
            "evidence": "gpu_lost",
            "culprit_node": "sim-7",
            "culprit_gpu": 5,
            "detail": "xid 79 (RESTART_BM)",
            "signal": "nvml",
            "suspects": "sim-7",
        },
        "watchd: hang GPU5 gp",
    ),
    "sim-8": (
        "straggler",
        {
            **FINDING,
            "hardware": True,
            "gpu": 2,
            "evidence": "thermal",
            "metric": "sm_clock",
            "deviation": -0.3,
            "duration_s": 300.0,
        },
        "watchd: slow GPU2 -3",
    ),
    "sim-9": (
        "check_result",
        {
            "check": "nccl",
            "check_type": "nccl",
            "passed": False,
            "outcome": "failed",
            "validation": False,
            "busbw_gbps": 312.0,
            "evidence": "nccl busbw 312 GB/s < 80% of 450 GB/s",
        },
        "watchd: nccl 312GB/s",
    ),
    "sim-10": (
        "check_result",
        {
            "check": "dcgm",
            "check_type": "dcgm-diag",
            "passed": False,
            "outcome": "failed",
            "validation": False,
            "failed_tests": "pcie",
            "evidence": "dcgm diag -r 2 failed: pcie",
        },
        "watchd: dcgm pcie: d",
    ),
}


def post(engine: Daemon, node: str, kind: str, attrs: dict[str, Any]) -> None:
    event = Event(id=f"sinfo-{node}", node=node, source="test", kind=kind, time=time.time(), attrs=attrs)
    request = urllib.request.Request(
        f"{engine.url}{INGEST_PATH}",
        data=json.dumps(batch_to_wire(node, [event])).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status in (200, 202), resp.status


def sinfo_r(cluster: SlurmCluster) -> dict[str, str]:
    """Plain ``sinfo -R`` (its default format), as node -> the REASON column."""
    out = cluster.run("sinfo", "-R", "-p", "sim").stdout
    lines = out.splitlines()
    assert lines[0].startswith("REASON               USER"), out  # %20E: 20 characters and a blank
    shown: dict[str, str] = {}
    for line in lines[1:]:
        for node in cluster.run("scontrol", "show", "hostnames", line.rsplit(None, 1)[1]).stdout.split():
            shown[node] = line[:20]
    return shown


@pytest.mark.real
def test_sinfo_r_tells_apart_every_kind_of_drain_the_default_pack_makes(
    sim: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(TOKEN)
    config = engine_config(free_port(), tmp_path / "token", "enforce", str(sim.conf_path))
    config["state"] = {"path": str(tmp_path / "state.db")}
    engine = Daemon("engine", config, tmp_path, env=sim.env)
    try:
        engine.wait_ready()
        for node, (kind, attrs, _) in DRAINS.items():
            post(engine, node, kind, attrs)
        wait_for(lambda: set(DRAINS) <= sim.drained("sim"), timeout=30, what="the drains")
        shown = sinfo_r(sim)
        print("\n" + sim.run("sinfo", "-R", "-p", "sim").stdout)  # what an admin sees (pytest -s)
        assert {n: shown.get(n) for n in DRAINS} == {n: d[2] for n, d in DRAINS.items()}
        assert len(set(shown[n] for n in DRAINS)) == len(DRAINS)
        # the whole reason is in scontrol show node and in the audit
        full = sim.reason("sim-1")
        assert full == "watchd: Xid79 3b:00 GPU has fallen off the bus (GPU 0000:3b:00.0)", full
        metrics = engine.get("/metrics")  # every Slurm command it ran, counted
        assert 'watchd_slurm_calls_total{command="scontrol"}' in metrics
        assert 'watchd_slurm_calls_total{command="squeue"}' in metrics
        audit = json.dumps(engine.get_json("/api/v1/actions?limit=100"))
        assert "Xid79 3b:00 GPU has fallen off the bus (GPU 0000:3b:00.0)" in audit
    finally:
        engine.stop()
        sim.reset_nodes(sim.sim_node_names)
