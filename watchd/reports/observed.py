"""Read what watchd observed (its state database) into the report's :class:`Observed`."""

from __future__ import annotations

import re

from watchd.reports.model import Fault, GpuUse, Observed
from watchd.store.database import Store

_REQUEUED = re.compile(r"requeued ([\w.,:-]+)")


def load_observed(store: Store, start: float, end: float) -> Observed:
    gpus = tuple(
        GpuUse(job=j, node=n, gpu=g, energy_j=e, gpu_s=s, idle_s=i, first=f, last=la)
        for j, n, g, e, s, i, f, la in store.usage.gpu_rows(start, end)
    )
    faults = []
    for node, at, action, detail in store.usage.faults(start - 86400.0, end):
        jobs: tuple[str, ...] = ()
        if action == "requeue":
            m = _REQUEUED.search(detail)
            jobs = tuple(j.removeprefix("slurm:") for j in m.group(1).split(",") if j) if m else ()
        faults.append(Fault(node=node, at=at, kind=action, jobs=jobs))
    return Observed(gpus=gpus, checkpoints=store.usage.checkpoints(), faults=tuple(faults))
