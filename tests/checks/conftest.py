"""The real Slurm test cluster's nodes with stand-in ``all_reduce_perf`` and ``dcgmi`` executables that print
the recorded real outputs (tests/data/checks): shared by the checks' tests on the real cluster.

The stand-ins read what to do from a file named after the node (``$SLURMD_NODENAME``): ``pass``, ``low``
(the recorded single-node pass with its largest size at 312 GB/s: a slow node), ``wrong`` (#wrong 3),
``crash`` (the recorded CUDA failure, exit 1), ``hang`` (sleeps past the time limit), ``slow`` (a pass after
4 s). Each writes when it
started and ended, so the share cap is checked on what slurmd really ran."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.slurm import SlurmCluster

DATA = Path(__file__).resolve().parent.parent / "data" / "checks"
NODES = ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]

STANDIN = """#!/bin/sh
# stand-in for {tool}: prints a recorded real output chosen by the node's behaviour file
dir={dir}
node=${{SLURMD_NODENAME:-unknown}}
echo "start $node $(date +%s.%N)" >> $dir/timeline
what=$(cat $dir/behaviour/$node 2>/dev/null || echo pass)
case "$what" in
  hang) sleep 300 ;;
  slow) sleep 4; cat $dir/out/{tool}-pass ;;
  crash) cat $dir/out/{tool}-crash; echo "end $node $(date +%s.%N)" >> $dir/timeline; exit 1 ;;
  *) cat $dir/out/{tool}-$what ;;
esac
echo "end $node $(date +%s.%N)" >> $dir/timeline
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def standins(tmp_path: Path) -> Path:
    d = tmp_path / "standins"
    (d / "behaviour").mkdir(parents=True)
    (d / "out").mkdir()
    passing = (DATA / "nccl" / "h100-8gpu-single-node-pass.txt").read_text()
    (d / "out" / "all_reduce_perf-pass").write_text(passing)
    (d / "out" / "all_reduce_perf-low").write_text(
        passing.replace("470.73", "312.00").replace("470.63", "311.80")
    )
    (d / "out" / "all_reduce_perf-wrong").write_text(
        (DATA / "nccl" / "derived-h100-8gpu-wrong3.txt").read_text()
    )
    (d / "out" / "all_reduce_perf-crash").write_text((DATA / "nccl" / "h100-cuda-failure.txt").read_text())
    (d / "out" / "dcgmi-pass").write_text((DATA / "dcgm" / "dcgm-4.4.2-r2-pass.txt").read_text())
    (d / "out" / "dcgmi-fail").write_text((DATA / "dcgm" / "dcgm-4.4.1-r2-b200-pcie-fail.txt").read_text())
    for tool in ("all_reduce_perf", "dcgmi"):
        _executable(d / tool, STANDIN.format(tool=tool, dir=d))
    d.chmod(0o755)
    tmp_path.chmod(0o755)
    return d


def behave(standins: Path, **what: str) -> None:
    for node, b in what.items():
        (standins / "behaviour" / node.replace("_", "-")).write_text(b)


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    slurm_cluster.reset_nodes(NODES)
    yield slurm_cluster
    jobs = slurm_cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
    slurm_cluster.cancel(*jobs)
    for r in slurm_cluster.run("scontrol", "show", "res", "-o", check=False).stdout.splitlines():
        if r.startswith("ReservationName="):
            slurm_cluster.run("scontrol", "delete", r.split()[0], check=False)
    slurm_cluster.reset_nodes(NODES)
