"""The ingest's fast decoder accepts only what the strict path accepts, and reads it to the same events: for
any body, either it refuses (the strict path then answers) or the strict path finds every event valid and
reads the same values, of the same types. The agents' own batches take the fast way."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.loadgen import NodeEncoder, agent_summaries
from watchd.model.events import Event, batch_from_wire, batch_to_wire, valid_batch_from_json


def _mostly(good: st.SearchStrategy[Any], edge: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` 39 times in 40, else ``edge``: most batches valid, each field sometimes broken."""
    return st.integers(0, 39).flatmap(lambda i: edge if i == 20 else good)  # not 0: drawn often


_good_text = st.text(
    st.characters(exclude_categories=("Cs", "Zs", "Cc", "Cf", "Co", "Cn", "Zl", "Zp")), min_size=1, max_size=6
)
_edge_text = st.sampled_from(["gpu 1", "gpu\t1", "", "\udc80", "x" * 129, "x" * 254, "y" * 8193, "é" * 8192])
_text = _mostly(_good_text, _edge_text)
_scalar = _mostly(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=6),
    ),
    st.one_of(
        st.integers(min_value=2**63, max_value=2**64),
        st.sampled_from([float("nan"), float("inf"), [1], {"a": 1}, "\udc80", "y" * 8193, "é" * 8192]),
    ),
)
_pci = _mostly(st.sampled_from(["0000:3b:00.0", "00000000:9B:00.0", "PCI:0000:3b:00"]), st.just("not-pci"))
_key = _mostly(st.text(max_size=4), st.sampled_from(["k" * 129, "\udc80"]))
_attrs = st.dictionaries(_key, _scalar, max_size=4)
_event = st.fixed_dictionaries(
    {
        "id": _text,
        "node": _text,
        "source": _mostly(st.sampled_from(["kmsg", "nvml"]), st.just("")),
        "kind": _mostly(st.sampled_from(["xid", "gpu_summary"]), st.just("k" * 65)),
        "time": _mostly(
            st.one_of(st.floats(min_value=0, max_value=1e11, exclude_max=True), st.integers(0, 2**36)),
            st.one_of(st.just(-1), st.just(1e11), st.just(float("nan")), st.booleans(), st.text(max_size=2)),
        ),
        "attrs": _mostly(
            st.one_of(_attrs, st.builds(lambda a, p: {**a, "pci_bus_id": p}, _attrs, _pci)),
            st.sampled_from([None, [], "x"]),
        ),
    },
)
_event = st.builds(lambda e, extra: {**e, **extra}, _event, _mostly(st.just({}), st.just({"extra": 1})))
_batch = st.fixed_dictionaries(
    {
        "version": _mostly(st.just(1), st.sampled_from([2, "1", None])),
        "node": st.just("gpu-1"),
        "events": st.lists(_event, max_size=4),
    }
)


def _typed(e: Event) -> tuple[Any, ...]:
    return (
        e.id,
        e.node,
        e.source,
        e.kind,
        e.time,
        type(e.time),
        [(k, v, type(v)) for k, v in e.attrs.items()],
    )


def _same_as_strict(raw: bytes, max_events: int = 3) -> bool:
    fast = valid_batch_from_json(raw, max_events)
    if fast is None:
        return False
    strict = batch_from_wire(json.loads(raw), max_events)
    assert strict.invalid == [] and fast.invalid == []
    assert [_typed(e) for e in fast.events] == [_typed(e) for e in strict.events]
    return True


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batch)
def test_what_the_fast_way_accepts_the_strict_way_accepts_alike(batch: dict[str, Any]) -> None:
    _same_as_strict(json.dumps(batch).encode())


def test_valid_events_of_every_shape_take_the_fast_way() -> None:
    events = [
        Event(
            "e1", "gpu-1", "kmsg", "xid", 1_760_000_000, {"xid": 79, "pci_bus_id": "0000:3b:00.0", "x": None}
        ),
        Event("e2", "gpu-1", "nvml", "gpu_health", 1.5, {"ok": True, "value": -2.5, "name": "é" * 8192}),
        Event("e3", "gpu-1", "nvml", "gpu_summary", 2.0, {}),
    ]
    raw = json.dumps(batch_to_wire("gpu-1", events)).encode()
    assert _same_as_strict(raw)


def test_broken_bodies_go_the_strict_way() -> None:
    ok = {"id": "e", "node": "gpu-1", "source": "kmsg", "kind": "xid", "time": 1.0, "attrs": {}}
    broken = [
        {**ok, "node": "gpu 1"},
        {**ok, "attrs": {"pci_bus_id": "garbage"}},
        {**ok, "attrs": {"n": 2**63}},
        {**ok, "unknown": 1},
        {**ok, "time": True},
    ]
    for event in broken:
        raw = json.dumps({"version": 1, "node": "gpu-1", "events": [ok, event]}).encode()
        assert valid_batch_from_json(raw, 10) is None
        assert len(batch_from_wire(json.loads(raw), 10).invalid) == 1
    for raw in [
        b'{"version":1,"events":[{"id":"e","node":"n","source":"s","kind":"k","time":NaN}]}',
        b"\xff",
        b"[]",
    ]:
        assert valid_batch_from_json(raw, 10) is None
    two = json.dumps({"version": 1, "node": "gpu-1", "events": [ok, ok]}).encode()
    assert valid_batch_from_json(two, 1) is None  # too many: the strict way names the limit


def test_the_agents_summaries_take_the_fast_way() -> None:
    template = agent_summaries()
    for job, events in ((("slurm:700001"), template[True]), (None, template[False])):
        body = NodeEncoder("gpu-00001", job, events, 1).body([1_760_000_005.0, 1_760_000_010.0], 5.0)
        assert _same_as_strict(body, 10_000)
