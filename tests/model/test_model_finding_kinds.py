"""Each finding kind is its own class on the attributes they share: the registry names it, a finding builds
it, an event of the kind reads back as it."""

from __future__ import annotations

from watchd.detect.finding import Finding
from watchd.model.finding import KINDS, Detection, HostStall, NcclHang, Straggler
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
