"""The fleet simulator (`watchd sim`) against a real engine in this process (dry-run, no scheduler, the
shipped rule pack): faults become the engine's decisions for exactly the faulty node; fleet files are
validated strictly with the key path in every error."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import watchd_command
from tests.support import eventually
from watchd.cli import main
from watchd.config import EngineConfig
from watchd.credentials import TokenSource
from watchd.engine.runner import Engine
from watchd.errors import ConfigError
from watchd.http_settings import Listen
from watchd.integrations.slurm.settings import SlurmConfig
from watchd.model.events import Event
from watchd.sim.fleet import parse_fleet
from watchd.sim.hostlist import expand_hostlist
from watchd.sim.simulator import Simulator

ROOT = Path(__file__).resolve().parent.parent.parent
TOKEN = "sim-test-token"


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    config = EngineConfig(
        listen=Listen(host="127.0.0.1", port=0),
        auth=TokenSource(token=TOKEN),
        mode="dry-run",
        rules=[ROOT / "rules"],
        slurm=SlurmConfig(enabled=False),
    )
    async with Engine(config, use_config_scheduler=False) as e:
        yield e


def drains(engine: Engine) -> list[Any]:
    return [a for a in engine.audit.recent(10_000) if a.action == "drain"]


async def test_ecc_dbe_on_one_node_drains_exactly_that_node(engine: Engine) -> None:
    fleet = parse_fleet(
        {
            "seed": 3,
            "nodes": {"count": 20},
            "interval_s": 0.5,
            "summary_window_s": 1,
            "jobs": [{"id": 4242, "nodes": "sim-[1-10]"}],
            "faults": [{"node": "sim-7", "at": 1.5, "kind": "ecc_dbe", "gpu": 2}],
        }
    )
    seen: list[Event] = []
    url = f"http://127.0.0.1:{engine.port}"
    async with Simulator(fleet, url, TOKEN, tap=seen.append) as sim:
        await eventually(lambda: bool(drains(engine)), timeout=15, what="a drain decision")
        await asyncio.sleep(2.0)  # any wrong decision for another node would have come by now
        stats = sim.stats()
    assert {a.node for a in drains(engine)} == {"sim-7"}
    decided = [a for a in drains(engine) if a.outcome == "dry_run"]
    assert len(decided) == 1 and "sim-7" in decided[0].detail
    assert stats.dropped == 0 and stats.queued == 0
    assert sim.stats().shipped == sim.stats().events  # everything, the flushed windows included

    # what reached the engine: the fault's Xids (48, then 63: remap pending) and health events, from sim-7
    # only; window summaries from every node, with the job on the nodes that run it
    faulty = [e for e in seen if e.kind in ("xid", "gpu_health")]
    assert {e.node for e in faulty} == {"sim-7"}
    assert sorted(e.attrs["xid"] for e in faulty if e.kind == "xid") == [48, 63]
    conditions = {e.attrs["condition"] for e in faulty if e.kind == "gpu_health"}
    assert {"ecc_dbe", "row_remap_pending"} <= conditions
    assert all(e.attrs.get("gpu") == 2 for e in faulty if e.kind == "gpu_health")
    summaries = [e for e in seen if e.kind == "gpu_summary"]
    assert {e.node for e in summaries} == {f"sim-{i}" for i in range(1, 21)}
    assert all(e.attrs.get("job") == "slurm:4242" for e in summaries if e.node == "sim-3")
    assert all("job" not in e.attrs for e in summaries if e.node == "sim-13")
    assert len({e.attrs["uuid"] for e in summaries}) == 20 * 8  # GPU UUIDs differ across nodes
    received = engine.metrics.registry.get_sample_value(
        "watchd_events_received_total", {"source": "fake", "kind": "gpu_summary"}
    )
    assert received == len(summaries)


async def test_nodes_are_spread_over_the_interval() -> None:
    fleet = parse_fleet({"nodes": {"count": 1000, "name": "n{i:04d}", "start": 0}, "interval_s": 5})
    sim = Simulator(fleet, "http://127.0.0.1:9", None, shutdown_flush_s=0.2)
    assert sim.slots == 50
    async with sim:  # nothing listens on port 9: events just queue
        sizes = [len(g) for g in sim._groups]
        assert sum(sizes) == 1000 and max(sizes) - min(sizes) <= 1
        assert sim.nodes[0].name == "n0000" and sim.nodes[-1].name == "n0999"
        await asyncio.sleep(0)


def test_hostlists() -> None:
    assert expand_hostlist("sim-3") == ["sim-3"]
    assert expand_hostlist("sim-[1-3,7]") == ["sim-1", "sim-2", "sim-3", "sim-7"]
    assert expand_hostlist("a-[08-10],b") == ["a-08", "a-09", "a-10", "b"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    for bad in ("sim-[1-", "sim-[3-1]", "sim-[a-b]", "sim-1,,sim-2"):
        with pytest.raises(ValueError):
            expand_hostlist(bad)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "f.yaml: nodes: Field required"),
        ({"nodes": {"count": 0}}, "f.yaml: nodes.count: Input should be greater than or equal to 1"),
        ({"nodes": {"count": 5, "name": "sim"}}, "f.yaml: nodes.name: pattern 'sim' must contain {i}"),
        ({"nodes": {"count": 5}, "interval": 5}, "f.yaml: interval: unknown key"),
        ({"nodes": {"count": 5}, "interval_s": 0}, "f.yaml: interval_s: Input should be greater than 0"),
        ({"nodes": {"count": 5}, "gpus": {"model": "X1"}}, "f.yaml: gpus: model 'X1' has no preset"),
        (
            {"nodes": {"count": 5}, "jobs": [{"id": 1, "nodes": "sim-[4-6]"}]},
            "f.yaml: jobs.0.nodes: unknown node 'sim-6' (nodes are sim-1..sim-5)",
        ),
        (
            {"nodes": {"count": 5}, "jobs": [{"id": 1, "nodes": "sim-1"}, {"id": 2, "nodes": ["sim-1"]}]},
            "f.yaml: jobs.1.nodes: sim-1 is already in jobs.0",
        ),
        ({"nodes": {"count": 5}, "jobs": [{"id": "x", "nodes": "sim-1"}]}, "f.yaml: jobs.0.id: 'x' is not"),
        ({"nodes": {"count": 5}, "jobs": [{"nodes": "sim-1"}]}, "f.yaml: jobs.0.id: Field required"),
        (
            {"nodes": {"count": 5}, "faults": [{"node": "sim-1", "kind": "ecc_dbe"}, {"kind": "ecc_dbe"}]},
            "f.yaml: faults.1.node: Field required",
        ),
        (
            {"nodes": {"count": 5}, "faults": [{"node": "sim-9", "kind": "ecc_dbe"}]},
            "f.yaml: faults.0.node: unknown node 'sim-9'",
        ),
        (
            {"nodes": {"count": 5}, "faults": [{"node": "sim-1", "kind": "ecc_dbe", "gpu": 8}]},
            "f.yaml: faults.0.gpu: GPU index 8 out of range (count is 8)",
        ),
        (
            {"nodes": {"count": 5}, "faults": [{"node": "sim-1", "kind": "thermal", "temp": 95}]},
            "f.yaml: faults.0.temp: unknown key",
        ),
        (
            {"nodes": {"count": 5}, "faults": [{"node": "sim-1", "kind": "melt"}]},
            "f.yaml: faults.0.kind: unknown fault kind 'melt'",
        ),
        ({"nodes": {"count": 5}, "faults": [{"node": "sim-1", "at": 5}]}, "f.yaml: faults.0.kind: missing"),
        (
            {"nodes": {"count": 5}, "faults": [{"node": "sim-1", "kind": "ecc_dbe", "at": -1}]},
            "f.yaml: faults.0.at: Input should be greater than or equal to 0",
        ),
        (
            {"nodes": {"count": 5}, "faults": [{"node": "sim-[1-", "kind": "ecc_dbe"}]},
            "f.yaml: faults.0.node: unbalanced brackets",
        ),
        ([1, 2], "f.yaml: expected a mapping at the top level, got list"),
    ],
)
def test_fleet_errors_name_the_key_path(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_fleet(data, "f.yaml")
    assert message in str(err.value)


def test_example_fleet_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", str(ROOT / "deploy" / "sim-fleet.yaml"), "--check"]) == 0
    assert capsys.readouterr().out.startswith("ok: 200 nodes (sim-1..sim-200) x 8 H100-SXM")


def test_bad_fleet_file_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("nodes: {count: 3}\nfaults: [{node: sim-4, kind: xid, code: 48}]\n")
    assert main(["sim", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"watchd sim: {path}: faults.0.node: unknown node 'sim-4' (nodes are sim-1..sim-3)"


@pytest.mark.real
async def test_the_command_runs_until_sigterm_and_summarizes(engine: Engine, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes: {count: 5}\ninterval_s: 0.5\nsummary_window_s: 1\n"
        "faults: [{node: sim-2, at: 0.5, kind: xid, code: 79, gpu: 1}]\n"
    )
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    proc = await asyncio.create_subprocess_exec(
        *watchd_command(),
        "sim",
        str(fleet),
        "--url",
        f"http://127.0.0.1:{engine.port}",
        "--token-file",
        str(token),
        "--progress",
        "0.5",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    await eventually(lambda: bool(drains(engine)), timeout=20, what="the Xid 79 drain")
    await asyncio.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    text = out.decode()
    assert proc.returncode == 0, text + err.decode()
    assert "sim: 5 nodes x 8 GPUs" in text and "until stopped" in text
    assert any(line.startswith("sim ") and "nodes 5" in line for line in text.splitlines())
    assert "sim: stopped after" in text and "0 dropped" in text and "xid 1" in text
    assert {a.node for a in drains(engine)} == {"sim-2"}


@pytest.mark.real
async def test_duration_ends_the_command(engine: Engine, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes: {count: 3}\ninterval_s: 0.5\nsummary_window_s: 1\nduration: 60\n")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    proc = await asyncio.create_subprocess_exec(
        *watchd_command(),
        "sim",
        str(fleet),
        "--url",
        f"http://127.0.0.1:{engine.port}",
        "--token-file",
        str(token),
        "--duration",
        "1.5",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, out.decode() + err.decode()
    assert "for 1.5 s" in out.decode() and "0 dropped" in out.decode()
