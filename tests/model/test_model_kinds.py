"""The typed kinds: reading and writing wire attrs, the registry, the one Xid builder, job labels."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchd.gpu.model import GpuSample
from watchd.model.conditions import GPU_CONDITIONS
from watchd.model.events import TOP_LEVEL_FIELDS, Event
from watchd.model.finding import KINDS as FINDING_KINDS
from watchd.model.finding import Detection
from watchd.model.gpu import GpuHealth, GpuSummary
from watchd.model.heartbeat import Heartbeat
from watchd.model.jobs import JobRef, job_label, parse_job_label
from watchd.model.kinds import KindError
from watchd.model.registry import ALL_KINDS, KINDS, fields_of
from watchd.model.xid import Xid
from watchd.rules import template
from watchd.xid import XidParser
from watchd.xid.render import record_to_json, xid_of_record


def test_required_fields_are_strict() -> None:
    with pytest.raises(KindError, match="condition: missing"):
        GpuHealth.from_attrs({"value": 1})
    with pytest.raises(KindError, match="gpu: not True"):
        GpuSummary.from_attrs({"gpu": True})
    with pytest.raises(KindError, match="value: not 'x'"):
        GpuHealth.from_attrs({"condition": "ecc_dbe", "value": "x"})


def test_optional_fields_are_lenient_and_lose_nothing() -> None:
    attrs = {"gpu": 0, "util_mean": "high", "power_mean": math.inf, "newer_agent_field": 7, "temp_mean": 40}
    s = GpuSummary.from_attrs(attrs)  # type: ignore[arg-type]
    assert s.util_mean is None and s.power_mean is None and s.temp_mean == 40
    assert s.extra == {"util_mean": "high", "power_mean": math.inf, "newer_agent_field": 7}
    assert s.to_attrs() == {"gpu": 0, "temp_mean": 40, **s.extra}


def test_none_is_left_out_unless_the_field_keeps_it() -> None:
    x = Xid.build(xid=79, pci_bus_id="0000:3b:00.0", message="GPU has fallen off the bus")
    attrs = x.to_attrs()
    assert attrs["uuid"] is None and attrs["pid"] is None and attrs["process"] is None
    assert "gpu" not in attrs and "raw" not in attrs and "recovery_action" not in attrs


def test_the_registry_names_every_kind_and_its_fields() -> None:
    trainlog = {
        "collective_timeout",
        "collective_report",
        "tcpstore_error",
        "nccl_warn",
        "nccl_ras",
        "flight_recorder",
    }
    assert set(KINDS) == {
        "xid",
        "gpu_health",
        "gpu_summary",
        "heartbeat",
        "watchd_action",
        "check_result",
        *FINDING_KINDS,
        *trainlog,
        "checkpoint_interval",  # issue 17
        "node_unavailable",
        "node_rebooted",  # a reboot watchd asked for is over
        "node_reboot_overdue",
        "ib_port_health",
        "node_gpu_reset",  # a GPU reset watchd asked for is done
    }
    assert set(KINDS) | {"node_repaired"} == ALL_KINDS
    for kind, cls in KINDS.items():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert not set(cls.fields()) & TOP_LEVEL_FIELDS, kind
    assert "job" in fields_of("xid") and "job" in fields_of("gpu_health")  # the engine adds it
    assert fields_of("node_repaired") == frozenset()


def test_template_tables_come_from_the_registry() -> None:
    assert template.COMMON_FIELDS is TOP_LEVEL_FIELDS
    assert {kind: fields_of(kind) for kind in KINDS} == template.KIND_FIELDS
    # what templates could name before the registry, they still can
    before_xid = {"xid", "pci_bus_id", "uuid", "pid", "process", "message", "meaning", "bucket", "action"}
    assert before_xid | {"raw", "recovery_action", "nvlink_link", "gpu", "job"} <= template.KIND_FIELDS["xid"]
    assert template.KIND_FIELDS["watchd_action"] == {"action", "outcome", "mode", "rule"}
    old_finding = {"job", "partition", "culprit_node", "culprit_gpu", "evidence", "hardware", "confidence"}
    old_finding |= {"suspects", "onset", "duration_s", "signal", "summary", "revision", "detail", "gpus"}
    old_finding |= {"gpus_matching", "metric", "value", "job_median", "deviation", "rank"}
    for kind in FINDING_KINDS:
        assert template.KIND_FIELDS[kind] == old_finding | {"gpu"}
    assert {
        "gpu",
        "uuid",
        "pci_bus_id",
        "model",
        "job",
        "value",
        "threshold",
        "evidence",
    } == template.GPU_FIELDS


def test_one_xid_builder_for_both_paths() -> None:
    """The kernel log and NVML build through Xid.build: the union of their attributes, each path filling
    what it knows (kernel log: pid, process, raw, details; NVML: gpu), nothing else differs."""
    (record,) = XidParser().feed("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off")
    kmsg = xid_of_record(record).to_attrs()
    nvml = Xid.build(
        xid=79, pci_bus_id="0000:3b:00.0", uuid="GPU-1", gpu=3, message="GPU has fallen off"
    ).to_attrs()
    assert list(kmsg) == [
        "xid", "pci_bus_id", "uuid", "pid", "process", "message", "meaning", "bucket", "action", "raw"
    ]  # fmt: skip
    assert list(nvml) == [
        "xid", "pci_bus_id", "uuid", "gpu", "pid", "process", "message", "meaning", "bucket", "action"
    ]  # fmt: skip
    assert kmsg["bucket"] == nvml["bucket"] == "RESTART_BM" and nvml["pid"] is None
    assert record_to_json(record) == kmsg  # watchd xid --json prints the event's attributes


def test_xid_details_never_replace_a_fixed_field() -> None:
    x = Xid.build(
        xid=154, pci_bus_id="p", message="m", details={"recovery_action": "GPU_RESET", "xid": 1, "new": 2}
    )
    assert x.xid == 154 and x.recovery_action == "GPU_RESET" and x.extra == {"new": 2}


def test_heartbeat_and_detection_round_trip() -> None:
    hb = {"job": "slurm:1", "rank": 0, "step": 3, "gpu": 1, "phase": "train", "reports": 4}
    assert Heartbeat.from_attrs(hb).to_attrs() == hb
    attrs = {
        "job": "j", "evidence": "none", "hardware": False, "confidence": 0.5, "suspects": "a,b", "onset": 1.0,
        "duration_s": 2.0, "signal": "nvml", "summary": "s", "revision": 0, "gpus": 2, "later": "x",
        "partition": "p",
    }  # fmt: skip
    d = Detection.from_attrs(attrs)  # type: ignore[arg-type]
    assert d.gpus == 2 and d.extra == {"later": "x"}
    assert list(d.to_attrs()) == list(attrs)  # extra stays before partition, as findings write it


def test_flag_conditions_name_boolean_sample_fields() -> None:
    sample_fields = {f.name: f.type for f in dataclasses.fields(GpuSample)}
    for c in GPU_CONDITIONS:
        if c.flag is not None:
            assert sample_fields[c.flag] == "bool | None", c.name
            assert c.set_evidence and c.clear_evidence
        if c.detail is not None:
            assert c.detail[0] in sample_fields
    assert {c.name for c in GPU_CONDITIONS if c.clock_reasons} == {
        "hw_slowdown",
        "thermal_slowdown",
        "power_brake",
    }


_WIDE_12 = "\uff11\uff12"  # fullwidth digits


@pytest.mark.parametrize(
    ("value", "label"),
    [
        ("slurm:1234", "slurm:1234"),
        ("1234", "slurm:1234"),
        (1234, "slurm:1234"),
        ("k8s:abcdef12", "k8s:abcdef12"),
        ("", None),
        (None, None),
        ("train-run-7", "train-run-7"),
        ("slurm:", "slurm:"),
        (f"slurm:{_WIDE_12}", f"slurm:{_WIDE_12}"),  # str.isdigit() says yes; not a Slurm job id
    ],
)
def test_job_label(value: object, label: str | None) -> None:
    assert job_label(value) == label


def test_job_labels_parse_back() -> None:
    assert parse_job_label("slurm:42") == JobRef("slurm", "42")
    assert parse_job_label("k8s:ABCDEF12-3456") == JobRef("k8s", "abcdef12-3456")
    assert parse_job_label("slurm:x") is None and parse_job_label("42") is None


_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "slurm:1", "0000:3b:00.0", "H100"]),
)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(st.sampled_from([*GpuSummary.fields(), "other"]), _ANY_VALUE, max_size=12),
    st.lists(st.sampled_from(GpuSummary.fields()), min_size=1, max_size=6, unique=True),
)
def test_a_picker_reads_its_fields_as_the_whole_read_does(attrs: dict[str, Any], names: list[str]) -> None:
    """A hot path's reader of a few fields (the fleet's, of a summary) gives what the whole read gives."""
    whole = GpuSummary.read(Event("e", "gpu-1", "nvml", GpuSummary.KIND, 1.0, attrs))
    picked = GpuSummary.picker(*names)(attrs)
    if whole is None:
        assert picked is None
    else:
        assert picked is not None
        assert [repr(v) for v in picked] == [repr(getattr(whole, n)) for n in names]


def test_a_picker_names_only_declared_fields() -> None:
    with pytest.raises(TypeError, match="declares no"):
        GpuSummary.picker("gpu", "nonsense")
