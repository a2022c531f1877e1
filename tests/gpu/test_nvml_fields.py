"""The table of NVML fields (watchd/gpu/nvml_fields.py) against the three that speak NVML: the real backend
reads nothing the table does not name, and the cost-faithful stand-in and the test fake answer every call
and field id in it (a call a stand-in lacks would make the field silently unsupported, or cost nothing)."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

import watchd.gpu.nvml as nvml_module
import watchd.gpu.nvml_reads as nvml_reads_module
from tests.gpu.test_gpu_nvml import FakeGpu, FakeNvml
from watchd.gpu.nvml import CADENCE, FIELDS, NvmlBackend
from watchd.gpu.nvml_fields import LIBRARY_CALLS, NVML_FIELDS, OLDER_NAMES, ROUND
from watchd.gpu.nvml_standin import StandinNvml

FIELD_CALLS = {call for f in NVML_FIELDS for call in f.calls}
FIELD_IDS = {fid for f in NVML_FIELDS for fid in f.field_ids}


def _bindings_names(source: str) -> Iterator[str]:
    """Every ``pynvml`` attribute ``source`` touches: ``lib.X``, ``self._lib.X``, ``getattr(lib, "X")``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "lib") or (
                isinstance(owner, ast.Attribute) and owner.attr == "_lib"
            ):
                yield node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            yield node.args[1].value


#: the backend: lifecycle, cadence, Xid events (nvml.py) and each field's reads and probes (nvml_reads.py)
BACKEND = {
    name for m in (nvml_module, nvml_reads_module) for name in _bindings_names(Path(m.__file__).read_text())
}
BACKEND_CALLS = {n for n in BACKEND if n.startswith("nvml") and not n.startswith("nvmlEventType")}


def undeclared(calls: set[str]) -> list[str]:
    return sorted(calls - FIELD_CALLS - set(LIBRARY_CALLS) - set(OLDER_NAMES))


def test_the_backend_calls_only_what_the_table_declares() -> None:
    assert len(BACKEND_CALLS) > 20  # the scan finds the calls at all
    assert undeclared(BACKEND_CALLS) == []
    assert undeclared({"nvmlDeviceGetGpuFabricInfo"}) == ["nvmlDeviceGetGpuFabricInfo"]  # it can fail
    # and every declared call is made (no stale row)
    assert sorted((FIELD_CALLS | set(LIBRARY_CALLS)) - BACKEND_CALLS) == []


def test_the_backend_samples_exactly_the_rows() -> None:
    assert tuple(f.name for f in NVML_FIELDS) == FIELDS and len(set(FIELDS)) == len(FIELDS)
    assert set(NvmlBackend._readers) == set(FIELDS)
    assert {f.name: f.cadence for f in NVML_FIELDS if f.cadence != ROUND} == CADENCE


def missing_from(lib: object, calls: set[str]) -> list[str]:
    return sorted(c for c in calls if not callable(getattr(lib, c, None)))


def test_the_stand_in_has_every_call_and_name_the_backend_reads() -> None:
    assert missing_from(StandinNvml, FIELD_CALLS | set(LIBRARY_CALLS)) == []
    # the constants and error classes the backend reads from the bindings
    names = {n for n in BACKEND if n.startswith(("NVML", "nvmlEventType"))}
    assert sorted(n for n in names if not hasattr(StandinNvml, n)) == []
    # and the check can fail: a stand-in without a field's call
    assert missing_from(object(), {"nvmlDeviceGetTemperature"}) == ["nvmlDeviceGetTemperature"]


def test_the_fake_has_every_call() -> None:
    assert missing_from(FakeNvml, FIELD_CALLS | set(LIBRARY_CALLS)) == []


def not_answered(lib: Any, handle: int) -> list[int]:
    """The table's field ids that ``nvmlDeviceGetFieldValues`` does not answer with a value."""
    asked = [(fid, 0xFFFFFFFF) if fid in (138, 139) else fid for fid in sorted(FIELD_IDS)]
    values = lib.nvmlDeviceGetFieldValues(handle, asked)
    return [fid for fid, v in zip(sorted(FIELD_IDS), values, strict=True) if int(v.nvmlReturn) != 0]


def test_the_stand_in_answers_every_field_id() -> None:
    lib = StandinNvml.h200(1)
    lib.gpus[0].nvlinks = 18  # an HGX board: the NVLink fields are supported
    lib.nvmlInit()
    assert not_answered(lib, 0) == []
    assert lib.calls["nvmlDeviceGetFieldValues"] == 1


def test_the_fake_answers_every_field_id(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(monkeypatch, [FakeGpu("GPU-aaaa", "00000000:18:00.0", pcie_counters=True)])
    assert not_answered(pynvml, 0) == []


def test_every_cost_names_a_call_of_the_table() -> None:
    """The measured costs stay as measured; each one is charged to a call the backend makes."""
    raw = json.loads(resources.files("watchd.gpu").joinpath("nvml_costs.json").read_text())
    declared = FIELD_CALLS | set(LIBRARY_CALLS)
    assert sorted(set(raw["calls"]) - declared) == []
    not_supported = {n for n in raw["not_supported"] if not n.startswith("field:")}
    assert sorted(not_supported - declared) == []
    ids = {int(n.split(":")[1]) for n in raw["not_supported"] if n.startswith("field:")}
    assert ids <= FIELD_IDS
