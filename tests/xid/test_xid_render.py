from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from watchd.errors import UsageError
from watchd.xid import XidRecord
from watchd.xid.render import record_to_json, render_table, run_xid

UUID = "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3b"
LOG = "\n".join(
    [
        "Dec  2 10:00:00 gpu-node-17 kernel: [ 5.000001] NVRM: GPU at PCI:0000:3b:00: " + UUID,
        "Dec  2 10:00:01 gpu-node-17 kernel: [12.345678] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, "
        "name=python3, GPU has fallen off the bus.",
        "Dec  2 10:00:01 gpu-node-17 kernel: [12.345679] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        "Dec  2 10:00:02 gpu-node-17 systemd[1]: Started Session 3.",
        "Dec  2 10:00:03 gpu-node-17 kernel: [13.000000] NVRM: Xid (PCI:0018:01:00): 154, GPU recovery "
        "action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        "Dec  2 10:00:04 gpu-node-17 kernel: [14.000000] NVRM: Xid (0000:01:00): 8, Channel 0000000a",
    ]
)


def records() -> list[XidRecord]:
    return [
        XidRecord(79, "0000:3b:00.0", 1234, "python3", "GPU has fallen off the bus.", "raw", UUID),
        XidRecord(13, "0018:01:00.0", None, None, "Graphics Exception", "raw"),
        XidRecord(
            154,
            "0009:01:00.0",
            None,
            None,
            "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            "raw",
            details={"recovery_action_from": 0, "recovery_action_to": 1, "recovery_action": "GPU_RESET"},
        ),
    ]


def test_table_is_aligned() -> None:
    lines = render_table(records()).split("\n")
    assert len(lines) == 4
    header = lines[0]
    assert header.split() == ["PCI", "XID", "PID", "PROCESS", "MEANING", "ACTION"]
    starts = [header.index(col) for col in ("XID", "PID", "PROCESS", "MEANING", "ACTION")]
    for line in lines[1:]:
        for start in starts:
            assert line[start - 2 : start] == "  "  # every column starts at the header's offset
            assert line[start] != " "
    assert lines[1].startswith("0000:3b:00.0  79   1234  python3  GPU has fallen off the bus")
    assert "drain node and reboot" in lines[1]
    assert lines[2].split()[:4] == ["0018:01:00.0", "13", "-", "-"]
    assert all(line == line.rstrip() for line in lines)


def test_table_keeps_one_line_per_record() -> None:
    rec = XidRecord(13, "0000:3b:00.0", 1, "weird\nname\twith  spaces", "m", "raw")
    lines = render_table([rec]).split("\n")
    assert len(lines) == 2
    assert "weird name with spaces" in lines[1]


def test_record_to_json() -> None:
    out = record_to_json(records()[2])
    assert out["xid"] == 154
    assert out["pci_bus_id"] == "0009:01:00.0"
    assert out["pid"] is None and out["process"] is None and out["uuid"] is None
    assert out["meaning"] == "GPU recovery action changed"
    assert out["bucket"] == "XID_154"
    assert out["action"]
    assert out["recovery_action_from"] == 0
    assert out["recovery_action_to"] == 1
    assert out["recovery_action"] == "GPU_RESET"
    assert json.loads(json.dumps(out)) == out


def test_details_never_replace_fixed_keys() -> None:
    rec = XidRecord(13, "0000:3b:00.0", 1, "p", "m", "raw", details={"xid": "spoofed", "extra": 1})
    out = record_to_json(rec)
    assert out["xid"] == 13
    assert out["extra"] == 1


def test_run_xid_on_a_file(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(LOG + "\n")
    stdout = io.StringIO()
    assert run_xid([str(path)], False, io.StringIO(), stdout) == 0
    lines = stdout.getvalue().rstrip("\n").split("\n")
    assert lines[0].split() == ["PCI", "XID", "PID", "PROCESS", "MEANING", "ACTION"]
    # the number-less 79 is the same failure as the explicit one before it
    assert [line.split()[1] for line in lines[1:]] == ["79", "154", "8"]


def test_run_xid_json(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(LOG)
    stdout = io.StringIO()
    assert run_xid([str(path)], True, io.StringIO(), stdout) == 0
    objs = [json.loads(line) for line in stdout.getvalue().splitlines()]
    assert [o["xid"] for o in objs] == [79, 154, 8]
    for o in objs:
        assert isinstance(o["xid"], int)
        assert isinstance(o["pci_bus_id"], str)
        assert o["pid"] is None or isinstance(o["pid"], int)
        assert o["process"] is None or isinstance(o["process"], str)
        for key in ("message", "meaning", "action", "bucket"):
            assert isinstance(o[key], str)
        assert "uuid" in o
    assert (objs[0]["pid"], objs[0]["process"], objs[0]["uuid"], objs[0]["bucket"]) == (
        1234,
        "python3",
        UUID,
        "RESTART_BM",
    )
    assert objs[1]["recovery_action"] == "NODE_REBOOT"
    assert objs[1]["pci_bus_id"] == "0018:01:00.0"
    assert objs[2]["pid"] is None


def test_run_xid_stdin_text() -> None:
    stdout = io.StringIO()
    assert run_xid([], False, io.StringIO(LOG), stdout) == 0
    assert "fallen off the bus" in stdout.getvalue()


def test_run_xid_stdin_bytes_with_invalid_utf8() -> None:
    data = b"\xff\xfe garbage \x00\n" + LOG.encode() + b"\n\xc3"
    stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    stdout = io.StringIO()
    assert run_xid(["-"], True, stdin, stdout) == 0
    assert len(stdout.getvalue().splitlines()) == 3


def test_run_xid_binary_junk_in_file(tmp_path: Path) -> None:
    path = tmp_path / "bin.log"
    path.write_bytes(b"\x00\xff\x80NVRM: \xff\n" + LOG.encode("utf-8"))
    stdout = io.StringIO()
    assert run_xid([str(path)], True, io.StringIO(), stdout) == 0
    assert len(stdout.getvalue().splitlines()) == 3


def test_run_xid_nothing_found(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_text("Dec  2 10:00:02 gpu-node-17 systemd[1]: Started Session 3.\n")
    stdout = io.StringIO()
    assert run_xid([str(path)], False, io.StringIO(), stdout) == 0
    assert stdout.getvalue() == "no Xid found\n"
    stdout = io.StringIO()
    assert run_xid([str(path)], True, io.StringIO(), stdout) == 0
    assert stdout.getvalue() == ""


def test_run_xid_one_parser_per_input(tmp_path: Path) -> None:
    first = tmp_path / "a.log"
    second = tmp_path / "b.log"
    first.write_text("NVRM: GPU at PCI:0000:3b:00: " + UUID + "\nNVRM: The NVIDIA GPU 0000:b3:00.0\n")
    second.write_text(
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, x\n"
        "NVRM: fallen off the bus and is not responding to commands.\n"
    )
    stdout = io.StringIO()
    run_xid([str(first), str(second)], True, io.StringIO(), stdout)
    [obj] = [json.loads(line) for line in stdout.getvalue().splitlines()]
    assert (obj["xid"], obj["uuid"]) == (13, None)


def test_run_xid_file_and_stdin(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_text("NVRM: Xid (0000:01:00): 8, Channel 0000000a\n")
    stdout = io.StringIO()
    run_xid([str(path), "-"], True, io.StringIO("NVRM: Xid (0000:02:00): 13, x\n"), stdout)
    assert [json.loads(line)["xid"] for line in stdout.getvalue().splitlines()] == [8, 13]


def test_run_xid_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.log"
    with pytest.raises(UsageError, match=r"nope\.log"):
        run_xid([str(missing)], False, io.StringIO(), io.StringIO())


def test_run_xid_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        run_xid([str(tmp_path)], True, io.StringIO(), io.StringIO())


MIG_LOG = "\n".join(
    [
        "Dec  2 10:00:01 gpu-node-17 kernel: NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: "
        "CE User Channel (0x9). RST: No, D-RST: No",
        "[Wed Dec  2 10:00:02 2026] NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:02): 95, pid=7, Uncontained",
        "Dec  2 10:00:03 gpu-node-17 kernel: NVRM: Xid (PCI:0000:3b:00): 167, PCIe fatal timeout",
    ]
)


def test_run_xid_names_the_mig_instances(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(MIG_LOG)
    stdout = io.StringIO()
    assert run_xid([str(path)], False, io.StringIO(), stdout) == 0
    header, gi, gi_ci, plain = stdout.getvalue().splitlines()
    assert header.split()[:3] == ["PCI", "MIG", "XID"]
    assert gi.startswith("0000:01:00.0  GI 5       94")
    assert gi_ci.startswith("0000:01:00.0  GI 1 CI 2  95")
    assert plain.startswith("0000:3b:00.0  -          167")
    assert "PCIe fatal timeout" in plain


def test_the_table_has_no_mig_column_without_mig_xids() -> None:
    assert render_table(records()).split("\n")[0].split() == [
        "PCI",
        "XID",
        "PID",
        "PROCESS",
        "MEANING",
        "ACTION",
    ]


def test_run_xid_json_names_the_mig_instances(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(MIG_LOG)
    stdout = io.StringIO()
    assert run_xid([str(path)], True, io.StringIO(), stdout) == 0
    gi, gi_ci, plain = (json.loads(line) for line in stdout.getvalue().splitlines())
    assert (gi["xid"], gi["gpu_instance"], "compute_instance" in gi) == (94, 5, False)
    assert (gi_ci["xid"], gi_ci["gpu_instance"], gi_ci["compute_instance"]) == (95, 1, 2)
    assert "gpu_instance" not in plain and "compute_instance" not in plain
    assert (plain["xid"], plain["bucket"], plain["meaning"]) == (167, "RESTART_BM", "PCIe fatal timeout")
