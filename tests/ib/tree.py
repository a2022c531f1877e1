"""Port trees for the tests and the benchmark, laid out as the kernel lays them out: the recorded ones
(tests/data/ib-sysfs, README there), copied to a writable folder, and a GPU node's eight NDR HCAs built from
the recorded ConnectX-4's file set and the kernel's format strings."""

from __future__ import annotations

import shutil
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "ib-sysfs"
RECORDED = DATA / "procfs" / "sys" / "class" / "infiniband"
NODE_EXPORTER = DATA / "node_exporter" / "sys" / "class" / "infiniband"
#: the recorded ConnectX-4 port whose counters/ and hw_counters/ every built HCA carries
MLX5_PORT = RECORDED / "mlx5_0" / "ports" / "1"


def copy_recorded(dest: Path, which: Path = RECORDED) -> Path:
    """A writable copy of a recorded class folder; its path (``.../sys/class/infiniband``)."""
    root = dest / "sys" / "class" / "infiniband"
    shutil.copytree(which, root)
    return root


def ndr_node(dest: Path, hcas: int = 8, *, names: list[str] | None = None) -> Path:
    """``hcas`` ConnectX-7 HCAs, one 4X NDR InfiniBand port each, ACTIVE; the class folder's path."""
    root = dest / "sys" / "class" / "infiniband"
    for i, name in enumerate(names or [f"mlx5_{i}" for i in range(hcas)]):
        add_hca(root, name, guid=f"e41d:2d03:007c:{i:04x}")
    return root


def add_hca(
    root: Path, name: str, *, guid: str = "e41d:2d03:007c:0001", rate: str = "400 Gb/sec (4X NDR)"
) -> Path:
    """One HCA with one ACTIVE port, as an NDR ConnectX-7 shows it; its port folder."""
    device = root / name
    port = device / "ports" / "1"
    shutil.copytree(MLX5_PORT / "counters", port / "counters")
    shutil.copytree(MLX5_PORT / "hw_counters", port / "hw_counters")
    write(device / "hca_type", "MT4129")
    write(device / "fw_ver", "28.39.1002")
    write(device / "board_id", "MT_0000000838")
    write(device / "node_guid", guid)
    write(port / "state", "4: ACTIVE")
    write(port / "phys_state", "5: LinkUp")
    write(port / "rate", rate)
    write(port / "link_layer", "InfiniBand")
    write(port / "lid", "0x12")
    write(port / "sm_lid", "0x1")
    write(port / "lid_mask_count", "0")
    write(port / "cap_mask", "0xa751e848")
    return port


def write(path: Path, line: str) -> None:
    """A sysfs attribute: one line, ending in a newline (sysfs_emit)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(line + "\n")


def port(root: Path, device: str, number: int = 1) -> Path:
    return root / device / "ports" / str(number)
