"""The parsers against every recorded real output (tests/data/checks/README.md cites each one), and against
broken input: empty, truncated, binary, huge."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchd.checks.parsers import parse_dcgm, parse_nccl

DATA = Path(__file__).resolve().parent.parent / "data" / "checks"
NCCL = {p.name: p.read_text() for p in sorted((DATA / "nccl").glob("*"))}
DCGM = {p.name: p.read_text() for p in sorted((DATA / "dcgm").glob("*"))}


def test_every_recorded_file_is_cited_in_the_readme() -> None:
    readme = (DATA / "README.md").read_text()
    missing = [
        f"{d}/{n}" for d, names in (("nccl", NCCL), ("dcgm", DCGM)) for n in names if f"{d}/{n}" not in readme
    ]
    assert missing == []


# file: rows, avg busbw, busbw at the largest size, #wrong, out-of-bounds, errors?, GPU model, columns,
# complete
NCCL_EXPECTED = {
    "h100-2node-16rank-wrong-columns.txt": (
        31,
        70.742,
        338.82,
        0,
        0,
        False,
        "NVIDIA H100 80GB HBM3",
        "wrong",
        True,
    ),
    "h100-8gpu-single-node-pass.txt": (
        4,
        448.212,
        470.73,
        0,
        0,
        False,
        "NVIDIA H100 80GB HBM3",
        "wrong",
        True,
    ),
    "ib-2node-ring-95gbps.txt": (5, 95.3009, 95.10, 0, 0, False, None, "wrong", True),
    "2080ti-old-error-column.txt": (11, None, 0.25, 0, None, False, None, None, False),
    "2080ti-old-error-column-tail.txt": (12, 6.6972, 21.86, 0, 0, False, None, None, True),
    "v100-error-column-header-truncated.txt": (
        1,
        None,
        0.0,
        0,
        None,
        False,
        "Tesla V100-PCIE-16GB",
        "error",
        False,
    ),
    "p5-mpirun-prefix-truncated.txt": (3, None, 0.0, 0, None, False, None, "wrong", False),
    "h100-cuda-failure.txt": (0, None, None, 0, None, True, None, None, False),
    "derived-h100-8gpu-wrong3.txt": (4, 448.212, 470.73, 3, 3, True, "NVIDIA H100 80GB HBM3", "wrong", True),
}


def test_every_nccl_file_has_expectations() -> None:
    assert set(NCCL) == set(NCCL_EXPECTED)


@pytest.mark.parametrize("name", sorted(NCCL_EXPECTED))
def test_nccl_recorded_outputs(name: str) -> None:
    rows, avg, busbw, wrong, oob, errors, model, columns, complete = NCCL_EXPECTED[name]
    r = parse_nccl(NCCL[name])
    assert len(r.rows) == rows
    assert r.avg_busbw == avg
    assert r.busbw == busbw
    assert r.wrong == wrong
    assert r.out_of_bounds == oob
    assert bool(r.errors) is errors
    assert r.gpu_model == model
    assert r.columns == columns
    assert r.complete is complete
    assert r.bad_rows == 0


def test_nccl_row_fields_in_place_and_out_of_place() -> None:
    r = parse_nccl(NCCL["h100-2node-16rank-wrong-columns.txt"])
    last = r.largest
    assert last is not None
    assert (last.size, last.count, last.type, last.redop) == (8589934592, 2147483648, "float", "sum")
    assert (last.oop_time_us, last.oop_algbw, last.oop_busbw, last.oop_wrong) == (47535, 180.71, 338.82, 0)
    assert (last.ip_time_us, last.ip_algbw, last.ip_busbw, last.ip_wrong) == (47743, 179.92, 337.35, 0)
    assert r.sizes(2) == "4294967296:330.58,8589934592:338.82"


def test_nccl_old_layout_without_redop_and_root_and_an_error_column() -> None:
    r = parse_nccl(NCCL["2080ti-old-error-column-tail.txt"])
    row = r.rows[0]
    assert (row.size, row.type, row.redop, row.oop_busbw, row.oop_wrong) == (65536, "float", None, 1.98, None)
    v100 = parse_nccl(NCCL["v100-error-column-header-truncated.txt"]).rows[0]
    assert v100.redop is None and v100.oop_wrong is None  # "error N/A", root column present


def test_nccl_failure_lines() -> None:
    r = parse_nccl(NCCL["h100-cuda-failure.txt"])
    assert r.errors[0] == "test: Test CUDA failure common.cu:941 'system not yet initialized'"
    derived = parse_nccl(NCCL["derived-h100-8gpu-wrong3.txt"])
    assert derived.errors == ("# Out of bounds values : 3 FAILED",)
    assert derived.largest is not None and derived.largest.oop_wrong == 3


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "\x00\xff garbage", "#" * 100_000, "8 2 float sum -1 x y z 0 1 2 3 0\n" * 3, "1 2 3\n"],
)
def test_nccl_bad_input_costs_only_itself(text: str) -> None:
    r = parse_nccl(text)
    assert r.rows == () and not r.complete and r.busbw is None


def test_nccl_truncated_mid_row_counts_a_bad_row() -> None:
    text = NCCL["h100-8gpu-single-node-pass.txt"]
    cut = text[: text.index("1073741824") + 30]
    r = parse_nccl(cut)
    assert len(r.rows) == 2 and r.bad_rows == 1 and not r.complete


def test_nccl_avg_failed_against_check_flag() -> None:
    r = parse_nccl("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 12.5 FAILED\n")
    assert r.avg_busbw == 12.5 and r.errors == ("# Avg bus bandwidth    : 12.5 FAILED",)


# (file, form, version, complete, failed tests, warned, skipped, errors?)
DCGM_EXPECTED = {
    "dcgm-3.0.4-r3-deployment-only-excerpt.txt": ("table", None, False, [], [], [], False),
    "dcgm-3.3.8-r3-fail-early-h100.txt": (
        "table",
        "3.3.8",
        True,
        ["GPU Memory"],
        [],
        ["PCIe", "Memory Bandwidth", "EUD Test"],
        False,
    ),
    "dcgm-xid64-row-remap-excerpt.txt": ("table", None, False, ["deployment"], [], [], False),
    "dcgm-4.4.2-r2-pass.txt": ("table", "4.4.2", True, [], [], [], False),
    "dcgm-4.2.3-r2-pcie-fail.txt": ("table", "4.2.3", False, ["pcie"], [], [], False),
    "dcgm-4.4.1-r2-b200-pcie-fail.txt": ("table", "4.4.1", True, ["pcie"], [], [], False),
    "dcgm-4.4-error-no-plugins.txt": ("none", None, False, [], [], [], True),
    "dcgm-3.1.0-json-pass.json": ("json", "3.1.0", True, [], [], [], False),
    "dcgm-4.2.3-json-gb10-software-fail.json": ("json", "4.2.3", True, ["software"], [], [], False),
    "dcgm-4-json-diagnostic-fragment.json": ("json", None, False, [], [], [], True),
}


def test_every_dcgm_file_has_expectations() -> None:
    assert set(DCGM) == set(DCGM_EXPECTED)


@pytest.mark.parametrize("name", sorted(DCGM_EXPECTED))
def test_dcgm_recorded_outputs(name: str) -> None:
    form, version, complete, failed, warned, skipped, errors = DCGM_EXPECTED[name]
    r = parse_dcgm(DCGM[name])
    assert r.form == form
    assert r.version == version
    assert r.complete is complete
    assert [t.name for t in r.with_status("fail")] == failed
    assert [t.name for t in r.with_status("warn")] == warned
    assert [t.name for t in r.with_status("skip")] == skipped
    assert bool(r.errors) is errors
    assert r.failed is bool(failed or errors)


def test_dcgm_3x_rows_and_wrapped_messages() -> None:
    r = parse_dcgm(DCGM["dcgm-3.3.8-r3-fail-early-h100.txt"])
    assert r.driver == "560.35.03"
    assert len(r.tests) == 13
    persistence = next(t for t in r.tests if t.name == "Persistence Mode")
    assert persistence.status == "pass"
    assert persistence.messages[0].startswith(
        "info: Persistence mode for GPU 0 is disabled. "
        'Enable persistence mode by running "nvidia-smi -i <gpuId>'
    )
    memory = next(t for t in r.tests if t.name == "GPU Memory")
    assert (memory.category, len(memory.messages)) == ("Hardware", 8)
    assert memory.messages[7].startswith("GPU 7 Error using CUDA API cuInit Check DCGM and system logs")
    assert "'system not yet initialized'" in memory.messages[0]


def test_dcgm_4x_per_gpu_statuses() -> None:
    r = parse_dcgm(DCGM["dcgm-4.4.1-r2-b200-pcie-fail.txt"])
    pcie = next(t for t in r.tests if t.name == "pcie")
    assert pcie.category == "Integration"
    assert pcie.gpus == {i: "pass" for i in range(8)}
    assert pcie.messages == [
        "There was an internal error during the test: 'Output of child process (11167) couldn't be parsed: "
        "'* Line 1, Column 1 Syntax error: value, object or array expected. '' Check DCGM and system logs "
        "for errors. Reset GPU. Restart DCGM. Rerun diagnostics."
    ]


def test_dcgm_json_versions() -> None:
    v3 = parse_dcgm(DCGM["dcgm-3.1.0-json-pass.json"])
    assert len(v3.tests) == 10  # the nulls between tests are skipped
    assert v3.tests[-1].gpus == {i: "pass" for i in range(8)}
    v4 = parse_dcgm(DCGM["dcgm-4.2.3-json-gb10-software-fail.json"])
    assert (v4.driver, v4.tests[0].gpus) == ("580.82.09", {0: "fail"})
    assert v4.tests[0].messages[0].startswith("Persistence Mode: Persistence mode for GPU 0 is disabled.")


@pytest.mark.parametrize(
    "text",
    ["", "{", "{}", "[1,2]", '{"DCGM Diagnostic": 5}', "\x00\x01", "| a | b |\n" * 1000, "+" * 100_000],
)
def test_dcgm_bad_input_costs_only_itself(text: str) -> None:
    r = parse_dcgm(text)
    assert not r.complete or r.tests == []
    assert not any(t.status == "pass" for t in r.tests)
