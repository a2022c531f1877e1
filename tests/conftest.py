"""Shared fixtures. The real Slurm cluster is started once per session, only when a test asks for it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# `pytest` (unlike `python -m pytest`) does not put the repo root on sys.path; the tests import `watchd` and
# `tests.harness` from it. (Equivalent to `pythonpath = ["."]` under [tool.pytest.ini_options].)
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.harness.slurm import SlurmCluster, available  # noqa: E402


def _must_run_real_components() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("WATCHD_REQUIRE_SLURM") == "1"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A real Slurm cluster: gpu-1..gpu-4 (partition ``gpu``, real slurmds) and sim-1..sim-200 (partition
    ``sim``, no slurmd). Skips when Slurm is unavailable, except under CI / WATCHD_REQUIRE_SLURM=1 where it
    fails. Tests share it: leave nodes resumed and jobs cancelled."""
    ok, why = available()
    if not ok:
        if _must_run_real_components():
            pytest.fail(f"Slurm test cluster required (CI / WATCHD_REQUIRE_SLURM=1) but unavailable: {why}")
        pytest.skip(why)
    cluster = SlurmCluster(real_nodes=4, simulated_nodes=200)
    cluster.start()  # raises with the log tails on failure: never a skip
    try:
        yield cluster
    finally:
        cluster.stop()
