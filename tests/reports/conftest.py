"""A Slurm cluster with accounting (slurmdbd + MariaDB, multifactor fair-share, gres/gpu), once per module
that asks for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import accounting
from tests.harness.slurm import SlurmCluster, available
from tests.support import real_components_required


@pytest.fixture(scope="module")
def acct_cluster() -> Iterator[SlurmCluster]:
    """gpu-1, gpu-2 with 4 GPUs each; accounts teama (fairshare 30), teamb (10), teamc (5); root in all
    three, user daemon in teamb."""
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
