"""Wire format version 1, replayed: batches recorded from the agent before the typed vocabulary
(tests/data/wire-v1) are still accepted, decode to the typed kinds without loss, re-encode byte for byte, and
today's builders produce them again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.model.wire_v1 import build
from watchd.detect.fleet import FleetState
from watchd.model.events import Event, batch_from_wire, batch_to_wire
from watchd.model.registry import KINDS

DATA = Path(__file__).resolve().parent.parent / "data" / "wire-v1"
FILES = sorted(p.stem for p in DATA.glob("*.json"))
#: Attributes no kind declares on purpose: fit_to_wire marks a cut text.
_WIRE_MARKS = {"truncated"}


def _recorded(name: str) -> bytes:
    return (DATA / f"{name}.json").read_bytes()


def _encode(node: str, events: list[Event]) -> bytes:
    return json.dumps(batch_to_wire(node, events), separators=(",", ":")).encode()


# kinds the engine makes itself and no agent ever ships: issue 21's check results, issue 17's advice
ENGINE_MADE = {
    "check_result",
    "checkpoint_interval",
    "node_unavailable",
    "node_rebooted",  # the engine's watch over the reboots it asked for
    "node_reboot_overdue",
    "node_gpu_reset",  # ... and over the GPU resets (the agent reports its result, not an event)
}


def test_every_kind_the_agents_send_is_recorded() -> None:
    assert len(FILES) == 9  # trainlog.json: issue 19; ib-sysfs.json: the InfiniBand ports
    kinds = {e["kind"] for name in FILES for e in json.loads(_recorded(name))["events"]}
    assert kinds == set(KINDS) - ENGINE_MADE


@pytest.mark.parametrize("name", FILES)
def test_recorded_batch_is_accepted_and_reencodes_identically(name: str) -> None:
    raw = _recorded(name)
    body = json.loads(raw)
    batch = batch_from_wire(body, max_events=10_000)
    assert batch.invalid == []
    assert len(batch.events) == len(body["events"])
    assert _encode(body["node"], batch.events) == raw


@pytest.mark.parametrize("name", FILES)
def test_recorded_batch_through_the_typed_kinds_is_byte_identical(name: str) -> None:
    raw = _recorded(name)
    body = json.loads(raw)
    rebuilt = []
    for event in batch_from_wire(body, max_events=10_000).events:
        typed = KINDS[event.kind].from_attrs(event.attrs)
        # every attribute the agents send is declared by its kind (a rename shows up here)
        assert set(typed.extra) <= _WIRE_MARKS, (event.kind, typed.extra)
        e = event
        rebuilt.append(typed.to_event(id=e.id, node=e.node, source=e.source, time=e.time, kind=e.kind))
    assert _encode(body["node"], rebuilt) == raw


@pytest.mark.parametrize("name", FILES)
def test_todays_builders_produce_the_recorded_bytes(name: str) -> None:
    assert build()[name] == _recorded(name)


def test_the_detectors_read_every_recorded_event() -> None:
    fleet = FleetState()
    events = [e for name in FILES for e in batch_from_wire(json.loads(_recorded(name)), 10_000).events]
    for event in events:
        fleet.observe(event)
    summaries = [e for e in events if e.kind == "gpu_summary"]
    assert {(e.node, e.attrs["gpu"]) for e in summaries} == set(fleet.gpus)
    for track in fleet.gpus.values():
        assert track.windows and track.model == "NVIDIA H200"
        assert any(w.power is not None and w.clock is not None for w in track.windows)
    pod = "k8s:0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    assert {t.job for t in fleet.gpus.values()} == {"slurm:4242", pod, None}  # GPU 2 runs no process
    assert set(fleet.ranks) == {"slurm:4242", "slurm:4243", pod}
    what = [h.what for h in fleet.hardware["gpu-07"]]
    assert "xid 79 (RESTART_BM)" in what and "xid 13 (RESTART_APP)" in what
    assert any(w.startswith("ecc_dbe: ") for w in what) and any(w.startswith("hw_slowdown: ") for w in what)
