"""The port files as machines recorded them (tests/data/ib-sysfs/README.md) read into snapshots: states by
number, rates with and without a speed name, counters, ``N/A (no PMA)``, the bounds, unreadable files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.ib.tree import NODE_EXPORTER, RECORDED, ndr_node, port, write
from watchd.ib.reader import SysfsReader
from watchd.ib.sysfs import Rate, parse_counter, parse_rate, parse_state
from watchd.model.ib import COUNTER_WIDTHS, PHYS_STATES, PORT_STATES


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)\n", Rate(400.0, 4, "NDR")),
        ("800 Gb/sec (4X XDR)\n", Rate(800.0, 4, "XDR")),
        ("25 Gb/sec (1X EDR)\n", Rate(25.0, 1, "EDR")),  # procfs's mlx5_0: a 1X link
        ("2.5 Gb/sec (1X SDR)\n", Rate(2.5, 1, "SDR")),
        ("56 Gb/sec (4X FDR)\n", Rate(56.0, 4, "FDR")),
        ("10 Gb/sec (4X)\n", Rate(10.0, 4, None)),  # node_exporter's i40iw0: no speed name
        ("", None),
        ("N/A\n", None),
    ],
)
def test_rates_in_the_kernels_format(text: str, expected: Rate | None) -> None:
    assert parse_rate(text) == expected


def test_states_are_read_by_number_whatever_the_name_says() -> None:
    assert parse_state("4: ACTIVE\n", PORT_STATES) == (4, "ACTIVE")
    assert parse_state("1: DOWN\n", PORT_STATES) == (1, "DOWN")
    assert parse_state("5: LinkUp\n", PHYS_STATES) == (5, "LinkUp")
    assert parse_state("3: Disabled\n", PHYS_STATES) == (3, "Disabled")
    # procfs's mlx5_0 records phys_state "4: ACTIVE": 4 is PortConfigurationTraining in the kernel's table
    assert parse_state("4: ACTIVE\n", PHYS_STATES) == (4, "PortConfigurationTraining")
    assert parse_state("9: <unknown>\n", PHYS_STATES) == (9, "<unknown>")
    assert parse_state("garbage", PORT_STATES) is None
    assert parse_state(None, PORT_STATES) is None


def test_counters_are_unsigned_integers_and_no_pma_is_none() -> None:
    assert parse_counter("4294967295\n") == 2**32 - 1
    assert parse_counter("0\n") == 0
    assert parse_counter("N/A (no PMA)\n") is None
    assert parse_counter("") is None
    assert parse_counter("-1\n") is None
    assert parse_counter(str(2**64) + "\n") is None


def test_the_recorded_procfs_tree_reads_as_recorded() -> None:
    reader = SysfsReader(RECORDED, hw_counters=["local_ack_timeout_err", "out_of_sequence", "no_such"])
    snap = reader.scan(100.0)
    assert snap.present and snap.skipped == 0
    by_key = {r.key: r for r in snap.ports}
    assert sorted(by_key) == ["hfi1_0:1", "mlx4_0:1", "mlx4_0:2", "mlx5_0:1"]
    hfi = by_key["hfi1_0:1"]
    assert (hfi.state, hfi.phys_state, hfi.rate, hfi.link_layer) == (
        4,
        5,
        Rate(100.0, 4, "EDR"),
        "InfiniBand",
    )
    assert hfi.hca_type is None  # hfi1 has no hca_type file
    assert hfi.counters["symbol_error"] == 0 and set(hfi.counters) == set(COUNTER_WIDTHS)
    assert by_key["mlx4_0:2"].link_layer == "InfiniBand"  # its file has a trailing empty line
    mlx5 = by_key["mlx5_0:1"]
    assert (mlx5.hca_type, mlx5.state, mlx5.phys_state, mlx5.rate) == ("MT4118", 4, 4, Rate(25.0, 1, "EDR"))
    assert dict(mlx5.hw_counters) == {"local_ack_timeout_err": 131, "out_of_sequence": 1}
    assert "port_xmit_data" not in mlx5.counters  # the data counters are not read (node_exporter has them)
    assert all(not r.unreadable and not r.unsupported for r in snap.ports)


def test_a_device_without_a_pma_reads_no_counters_and_says_so() -> None:
    snap = SysfsReader(NODE_EXPORTER).scan(100.0)
    by_key = {r.key: r for r in snap.ports}
    iwarp = by_key["i40iw0:1"]
    assert iwarp.counters == {} and len(iwarp.unsupported) == 12
    assert (iwarp.state, iwarp.rate, iwarp.hca_type) == (4, Rate(10.0, 4, None), "I40IW")
    assert not iwarp.unreadable
    assert set(by_key["mlx4_0:2"].counters) == {"link_downed", "link_error_recovery"}  # what it has


def test_devices_and_ports_are_bounded_and_filtered(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 8)
    snap = SysfsReader(root, max_devices=3).scan(1.0)
    assert [r.key for r in snap.ports] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1"] and snap.skipped == 5
    snap = SysfsReader(root, max_ports=2).scan(1.0)
    assert len(snap.ports) == 2 and snap.skipped == 6
    snap = SysfsReader(root, devices=["mlx5_[4-7]"]).scan(1.0)
    assert [r.device for r in snap.ports] == ["mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]


def test_no_class_folder_is_an_absent_snapshot(tmp_path: Path) -> None:
    snap = SysfsReader(tmp_path / "sys" / "class" / "infiniband").scan(5.0)
    assert (snap.present, snap.ports, snap.time) == (False, (), 5.0)


def test_an_unreadable_file_is_named_and_leaves_its_value_unknown(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 2)
    p = port(root, "mlx5_1")
    (p / "rate").unlink()
    (p / "rate").mkdir()  # read() fails (EISDIR), as a driver's error would
    (p / "counters" / "symbol_error").unlink()
    os.symlink("/etc/passwd", p / "counters" / "symbol_error")  # refused (O_NOFOLLOW), never followed
    seen: list[tuple[str, str]] = []
    snap = SysfsReader(root, on_unreadable=lambda path, why: seen.append((path, why))).scan(1.0)
    r = {x.key: x for x in snap.ports}["mlx5_1:1"]
    assert r.rate is None and "symbol_error" not in r.counters and r.state == 4
    assert sorted(r.unreadable) == ["counters/symbol_error", "rate"]
    assert sorted(why for _, why in seen) == ["EISDIR", "ELOOP"]


def test_a_port_layout_is_learned_once_and_again_after_its_device_comes_back(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 1)
    reader = SysfsReader(root, hw_counters=["out_of_sequence"])
    assert "out_of_sequence" in reader.scan(1.0).ports[0].hw_counters
    saved = tmp_path / "saved"
    shutil.move(root / "mlx5_0", saved)
    assert reader.scan(2.0).ports == ()
    shutil.move(saved, root / "mlx5_0")
    shutil.rmtree(port(root, "mlx5_0") / "hw_counters")  # a driver without them
    write(port(root, "mlx5_0") / "counters" / "symbol_error", "7")
    r = reader.scan(3.0).ports[0]
    assert r.hw_counters == {} and r.counters["symbol_error"] == 7
