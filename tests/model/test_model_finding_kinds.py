"""Each finding kind is its own class on the attributes they share: the registry names it, a finding builds
it, an event of the kind reads back as it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from watchd.detect.finding import Finding
from watchd.model.finding import KINDS, Detection, HostStall, NcclHang, Straggler
from watchd.model.kinds import KindError
from watchd.model.registry import KINDS as REGISTRY


def test_each_finding_kind_has_its_class() -> None:
    classes = {"nccl_hang": NcclHang, "host_stall": HostStall, "straggler": Straggler}
    assert {kind: REGISTRY[kind] for kind in KINDS} == classes
    for kind, cls in classes.items():
        assert issubclass(cls, Detection) and kind == cls.KIND
        assert cls.fields() == Detection.fields()  # the same attributes: the rules see no difference


def test_a_finding_builds_its_kinds_class_and_reads_back_as_it() -> None:
    for kind in KINDS:
        f = Finding(kind, "slurm:7", 130.0, 100.0, "s", 0.8, culprit_node="n2", suspects=("n2", "n3"))
        detection = f.detection()
        assert type(detection) is REGISTRY[kind]
        event = f.to_event()
        assert event.kind == kind
        back = REGISTRY[kind].read(event)
        assert back == detection and type(back) is REGISTRY[kind]
        # a kind's class names its own kind
        assert detection.to_event(id="x", node="n2", source="detector", time=1.0).kind == kind


def test_suspects_are_a_list_read_from_the_old_comma_form_and_from_an_array() -> None:
    """A finding's suspects are a tuple in its class; the wire (version 1) writes them comma-joined, as the
    engines before wrote them (tests/data/wire-v1), and reading takes that form or a JSON array alike."""
    recorded = json.loads((Path(__file__).parent.parent / "data" / "wire-v1" / "findings.json").read_text())
    old = next(e for e in recorded["events"] if e["kind"] == "nccl_hang")
    assert old["attrs"]["suspects"] == "gpu-07,gpu-08"  # the old form
    hang = NcclHang.from_attrs(old["attrs"])
    assert hang.suspects == ("gpu-07", "gpu-08")
    assert hang.to_attrs() == old["attrs"]  # written again as it was recorded
    as_array = NcclHang.from_attrs({**old["attrs"], "suspects": ["gpu-07", "gpu-08"]})
    assert as_array == hang
    assert NcclHang.from_attrs({**old["attrs"], "suspects": ""}).suspects == ()
    # a mistyped list is refused like any mistyped required field
    with pytest.raises(KindError, match="suspects"):
        NcclHang.from_attrs({**old["attrs"], "suspects": ["gpu-07", 8]})
    # a reader of a few fields reads the list the same way
    assert NcclHang.picker("suspects", "job")(old["attrs"]) == (("gpu-07", "gpu-08"), "slurm:4242")
