"""A real cluster without slurmdbd (AccountingStorageType=accounting_storage/none): the source says so and
still reports the pending jobs; the report falls back to what watchd observed itself."""

from __future__ import annotations

import time

from tests.harness.slurm import SlurmCluster
from watchd.reports.core import build_report
from watchd.reports.model import GpuUse, Observed
from watchd.reports.render import to_table
from watchd.reports.source import SlurmAccounting


def test_without_slurmdbd_the_report_says_so_and_falls_back(slurm_cluster: SlurmCluster) -> None:
    now = time.time()
    held = slurm_cluster.submit("sleep 1", nodes=1, extra_args=["--hold"])
    try:
        acct = SlurmAccounting(env=slurm_cluster.env).fetch(now - 3600, now + 60)
    finally:
        slurm_cluster.cancel(held)
    assert not acct.available
    assert "accounting" in acct.why.lower() and "sacct" in acct.why
    assert [(p.job_id, p.reason) for p in acct.pending] == [(held, "JobHeldUser")]
    observed = Observed(
        gpus=(GpuUse("7", "gpu-1", 0, 7.2e6, 3600.0, 1800.0, now - 3600, now, account="teama"),)
    )
    report = build_report(acct, observed, start=now - 3600, end=now + 60, now=now)
    row = {r.key["account"]: r for r in report.rows}["teama"]
    assert row.energy_kwh == 2.0 and row.idle_gpu_hours == 0.5 and row.gpu_hours == 0.0
    assert "NO ACCOUNTING" in to_table(report)
