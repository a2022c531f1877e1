"""The InfiniBand port events of the recorded wire batch ``tests/data/wire-v1/ib-sysfs.json``: each
condition starting, repeating and clearing, as the agent builds them from a port tree (tests/ib/tree.py)
read and judged scan by scan."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tests.ib.tree import ndr_node, port, write
from watchd.ib.judge import IbJudge
from watchd.ib.reader import SysfsReader
from watchd.model.events import Event


def ib_events(node: str, t0: float) -> list[Event]:
    out: list[Event] = []
    with tempfile.TemporaryDirectory(prefix="watchd-ib-wire-") as tmp:
        root = ndr_node(Path(tmp), 4)
        reader = SysfsReader(root, hw_counters=["out_of_sequence"])
        judge = IbJudge(node)
        steps = [
            lambda: None,
            lambda: (
                write(port(root, "mlx5_1") / "state", "1: DOWN"),
                write(port(root, "mlx5_1") / "phys_state", "3: Disabled"),
            ),
            lambda: write(port(root, "mlx5_2") / "rate", "200 Gb/sec (2X NDR)"),
            lambda: (
                write(port(root, "mlx5_3") / "counters" / "symbol_error", "65535"),
                write(port(root, "mlx5_3") / "counters" / "link_downed", "2"),
            ),
            lambda: shutil.move(root / "mlx5_0", Path(tmp) / "mlx5_0"),
            lambda: None,
            lambda: None,
            lambda: None,
            lambda: (
                write(port(root, "mlx5_1") / "state", "4: ACTIVE"),
                write(port(root, "mlx5_1") / "phys_state", "5: LinkUp"),
            ),
            lambda: write(port(root, "mlx5_2") / "rate", "400 Gb/sec (4X NDR)"),
            lambda: shutil.move(Path(tmp) / "mlx5_0", root / "mlx5_0"),
        ]
        for i, step in enumerate(steps):
            step()
            out += judge.observe(reader.scan(t0 + 30.0 * i))
        for i in range(10):  # the counters' rises leave the window
            out += judge.observe(reader.scan(t0 + 30.0 * (len(steps) + i)))
    return out
