"""Wire validation (issue 16 items 1, 8, 10): each event is held to the shapes the vocabulary knows. A broken
event is set aside with its index and reason; its neighbours are accepted; valid events are unchanged."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from watchd.model.events import Event, WireError, batch_from_wire, event_from_wire


def _event(**over: Any) -> dict[str, Any]:
    attrs = over.pop("attrs", {"xid": 79, "pci_bus_id": "0000:3b:00.0", "gpu": 0, "value": 1.5})
    return {
        "id": "e1",
        "node": "gpu-1",
        "source": "kmsg",
        "kind": "xid",
        "time": time.time(),
        "attrs": attrs,
        **over,
    }


def _refused(obj: dict[str, Any], fragment: str) -> None:
    with pytest.raises(WireError, match=fragment):
        event_from_wire(obj, "events[0]")


def test_a_valid_event_is_read_unchanged() -> None:
    obj = _event()
    event = event_from_wire(obj, "events[0]")
    assert event == Event(obj["id"], obj["node"], obj["source"], obj["kind"], obj["time"], obj["attrs"])
    assert event.to_wire() == obj


@pytest.mark.parametrize("field", ["id", "node", "source", "kind"])
def test_a_lone_surrogate_in_a_top_level_field_is_refused(field: str) -> None:
    obj = json.loads(json.dumps(_event()).replace(f'"{field}": "', f'"{field}": "\\udc80', 1))
    _refused(obj, f"events\\[0\\].{field}: not valid Unicode|events\\[0\\].node: expected a printable")


def test_a_lone_surrogate_in_an_attr_key_or_value_is_refused() -> None:
    _refused(_event(attrs={"pci_bus_id": "0000:3b:00.0\udc80"}), "pci_bus_id: expected a PCI address")
    _refused(_event(attrs={"message": "x\ud800"}), "message: not valid Unicode")
    _refused(_event(attrs={"k\udc80": 1}), "a key that is not valid Unicode")


def test_a_surrogate_pair_decoded_from_json_is_valid_text() -> None:
    obj = json.loads('{"m": "\\ud83d\\ude00"}')  # one emoji, escaped as a pair: not a lone surrogate
    assert event_from_wire(_event(attrs={"message": obj["m"]}), "e").attrs["message"] == "\U0001f600"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused(value: float) -> None:
    _refused(_event(attrs={"value": value}), "finite number")


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**30])
def test_integers_past_64_bits_are_refused(value: int) -> None:
    _refused(_event(attrs={"gpu": value}), "64-bit")


def test_integers_at_the_64_bit_bounds_are_accepted() -> None:
    event = event_from_wire(_event(attrs={"a": 2**63 - 1, "b": -(2**63)}), "e")
    assert event.attrs == {"a": 2**63 - 1, "b": -(2**63)}


@pytest.mark.parametrize(
    "pci", ["0000:3b:00.0", "00000000:9B:00.0", "PCI:0018:3b:00", "0009:01:00", "3b:00.0", "0000:3b:1f.7"]
)
def test_what_the_xid_normaliser_accepts_is_a_pci_bus_id(pci: str) -> None:
    assert event_from_wire(_event(attrs={"pci_bus_id": pci}), "e").attrs["pci_bus_id"] == pci  # unchanged


@pytest.mark.parametrize("pci", ["0" * 8000, "", "0000:3b:00.0 junk", "gpu0", "0000:3b:20.0", "0000:3b:00.8"])
def test_a_pci_bus_id_that_is_not_a_pci_address_is_refused(pci: str) -> None:
    _refused(_event(attrs={"pci_bus_id": pci}), "PCI address")


@pytest.mark.parametrize("value", [3, 1.0, True])
def test_a_pci_bus_id_that_is_not_text_is_refused(value: object) -> None:
    _refused(_event(attrs={"pci_bus_id": value}), "PCI address")


def test_a_null_pci_bus_id_is_accepted() -> None:
    assert event_from_wire(_event(attrs={"pci_bus_id": None}), "e").attrs == {"pci_bus_id": None}


@pytest.mark.parametrize("node", ["gpu-1\n", "gpu 1", "\x00", "a\u202eb", "n" * 254, "\t"])
def test_node_names_are_bounded_and_printable(node: str) -> None:
    _refused(_event(node=node), "node")


@pytest.mark.parametrize("node", ["gpu-1", "node001.cluster.local", "n" * 253, "Ω-7", "rack3_gpu[2]"])
def test_ordinary_node_names_are_accepted(node: str) -> None:
    assert event_from_wire(_event(node=node), "e").node == node


def test_a_broken_event_costs_only_itself() -> None:
    events = [
        _event(id="ok-1"),
        _event(id="bad-nan", attrs={"value": float("nan")}),
        _event(id="bad-pci", attrs={"pci_bus_id": "x" * 100}),
        _event(id="bad-node", node="a\udc80"),
        _event(id="ok-2"),
    ]
    wire = batch_from_wire({"version": 1, "node": "gpu-1", "events": events}, 100)
    assert [e.id for e in wire.events] == ["ok-1", "ok-2"]
    assert [i for i, _ in wire.invalid] == [1, 2, 3]
    for _, reason in wire.invalid:
        reason.encode("utf-8")  # a reason can be logged and answered as it is
