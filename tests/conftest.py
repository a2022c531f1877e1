"""Shared fixtures. The real Slurm cluster is started once per session, only when a test asks for it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.harness import accounting
from tests.harness.alertmanager import AlertmanagerProcess
from tests.harness.alertmanager import available as am_available
from tests.harness.slurm import SlurmCluster, available
from tests.support import real_components_required

#: Fixtures that start real servers: a test using one starts real processes.
_REAL_FIXTURES = frozenset({"slurm_cluster", "acct_cluster", "alertmanager", "sim", "promtool"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``real`` on every test that starts real processes (marked by hand, or through a real fixture or the
    ``slurm`` marker), so ``pytest -m "not real"`` is the fast loop."""
    for item in items:
        if item.get_closest_marker("slurm") or _REAL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A real Slurm cluster: gpu-1..gpu-4 (partition ``gpu``, real slurmds) and sim-1..sim-200 (partition
    ``sim``, no slurmd). Skips when Slurm is unavailable, except under CI / WATCHD_REQUIRE_SLURM=1 where it
    fails. Tests share it: leave nodes resumed and jobs cancelled."""
    ok, why = available()
    if not ok:
        if real_components_required():
            pytest.fail(f"Slurm test cluster required (CI / WATCHD_REQUIRE_SLURM=1) but unavailable: {why}")
        pytest.skip(why)
    cluster = SlurmCluster(real_nodes=4, simulated_nodes=200)
    cluster.start()  # raises with the log tails on failure: never a skip
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def alertmanager() -> Iterator[AlertmanagerProcess]:
    """A real Alertmanager on loopback (``.url``). Skips when unavailable, except under CI /
    WATCHD_REQUIRE_SLURM=1 where it fails. Shared by the tests: give each alert a unique alertname."""
    ok, why = am_available()
    if not ok:
        if real_components_required():
            pytest.fail(f"Alertmanager required (CI / WATCHD_REQUIRE_SLURM=1) but unavailable: {why}")
        pytest.skip(why)
    with AlertmanagerProcess() as am:  # raises with the log tail on failure: never a skip
        yield am


@pytest.fixture
def sim(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster with its simulated nodes (partition ``sim``) resumed before and after the test."""
    slurm_cluster.reset_nodes(slurm_cluster.sim_node_names)
    yield slurm_cluster
    slurm_cluster.reset_nodes(slurm_cluster.sim_node_names)


@pytest.fixture
def promtool() -> str:
    """The path of Prometheus' ``promtool`` (Debian package prometheus); skips without it, fails under CI."""
    path = shutil.which("promtool")
    if path is None:
        if real_components_required():
            pytest.fail("promtool is required here (CI) but not installed: apt-get install prometheus")
        pytest.skip("promtool is not installed (Debian package prometheus)")
    return path


@pytest.fixture(scope="session")
def acct_cluster() -> Iterator[SlurmCluster]:
    """A Slurm cluster with accounting (slurmdbd + MariaDB, multifactor fair-share, gres/gpu): gpu-1, gpu-2
    with 4 GPUs each; accounts teama (fairshare 30), teamb (10), teamc (5); root in all three, user daemon in
    teamb. Tests share it: leave users, nodes and jobs as they found them."""
    for ok, why in (available(), accounting.available()):
        if not ok:
            if real_components_required():
                pytest.fail(f"Slurm accounting required (CI / WATCHD_REQUIRE_SLURM=1) but unavailable: {why}")
            pytest.skip(why)
    cluster = SlurmCluster(real_nodes=2, accounting=True, gpus_per_node=4)
    cluster.start()
    try:
        for name, share in (("teama", 30), ("teamb", 10), ("teamc", 5)):
            cluster.sacctmgr("add", "account", name, f"fairshare={share}")
        cluster.sacctmgr("add", "user", "root", "account=teama,teamb,teamc", "defaultaccount=teama")
        cluster.sacctmgr("add", "user", "daemon", "account=teamb")
        assert cluster.dir is not None
        (cluster.dir / "jobs").chmod(0o777)  # jobs of user daemon write their output there
        yield cluster
    finally:
        cluster.stop()
