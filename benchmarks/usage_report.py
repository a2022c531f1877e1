"""The usage report over 30 days of a 1,000-node (8 GPUs each) cluster's accounting.

Synthetic finished jobs (one after another on every node, 1 to 16 nodes x 8 GPUs, 20 accounts, lognormal
durations around 4 h) are inserted as rows into the real slurmdbd's MariaDB job table of a test cluster with
accounting (tests/harness/accounting.py), and watchd's observations (energy and idle time per job GPU and
day) into a real state database. Then timed, in seconds:

- ``fetch``: ``sacct`` (+ ``sshare``, ``squeue``) over the 30 days and parsing (SlurmAccounting.fetch);
- ``observed``: reading the observations from the state database;
- ``build``: the pure report by account (and by account, user, partition);
- ``render``: table, CSV, JSON, HTML.

Floors, measured in the same run: ``sacct -o JobIDRaw`` over the same window (the database read and print
alone), and one pass over the records summing GPU-seconds (the least any report does). Figures go to stdout
(and ``--json``).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness.accounting import SyntheticJob, insert_jobs  # noqa: E402
from tests.harness.slurm import SlurmCluster  # noqa: E402
from watchd.reports.core import build_report  # noqa: E402
from watchd.reports.html import to_html  # noqa: E402
from watchd.reports.observed import load_observed  # noqa: E402
from watchd.reports.render import to_csv, to_json, to_table  # noqa: E402
from watchd.reports.source import SlurmAccounting  # noqa: E402
from watchd.store.database import Store  # noqa: E402

DAY = 86400


def synthetic(nodes: int, days: int, accounts: list[str], end: int, seed: int = 18) -> list[SyntheticJob]:
    rng = random.Random(seed)
    start0 = end - days * DAY
    jobs: list[SyntheticJob] = []
    jid = 1_000_000
    # blocks of 16 nodes; each block runs one job after another, 1..16 nodes wide
    for block in range(0, nodes, 16):
        t = start0 + rng.randrange(3600)
        while t < end - 600:
            width = rng.choice((1, 1, 1, 2, 4, 8, 16))
            first = block + rng.randrange(0, 16 - width + 1)
            dur = int(min(3 * DAY, max(300, rng.lognormvariate(9.5, 1.0))))
            wait = int(rng.expovariate(1 / 900))
            nodelist = f"node-[{first + 1:04d}-{first + width:04d}]" if width > 1 else f"node-{first + 1:04d}"
            jobs.append(
                SyntheticJob(
                    job_id=jid,
                    account=rng.choice(accounts),
                    partition="gpu",
                    gpus=8 * width,
                    nodes=width,
                    nodelist=nodelist,
                    submit=t - wait,
                    start=t,
                    end=min(end - 1, t + dur),
                    state="COMPLETED" if rng.random() > 0.02 else "NODE_FAIL",
                )
            )
            jid += 1
            t += dur // max(1, 16 // width) + rng.randrange(60)
    return jobs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    accounts = [f"team{i:02d}" for i in range(20)]
    end = int(time.time()) // 3600 * 3600
    start = end - args.days * DAY
    figures: dict[str, object] = {"where": "this machine (2 shared cores), real slurmdbd + MariaDB 10.11"}
    with (
        SlurmCluster(real_nodes=1, accounting=True, gpus_per_node=8) as c,
        tempfile.TemporaryDirectory() as tmp,
    ):
        assert c.acct is not None
        c.sacctmgr("add", "account", ",".join(accounts))
        c.sacctmgr("add", "user", "root", f"account={','.join(accounts)}")
        jobs = synthetic(args.nodes, args.days, accounts, end)
        t = time.perf_counter()
        insert_jobs(c.acct, c.cluster_name, jobs)
        figures["jobs"] = len(jobs)
        figures["insert_s"] = round(time.perf_counter() - t, 2)

        store = Store.open(Path(tmp) / "state.db")
        rows = []
        for j in jobs:
            for n in range(j.nodes):
                for g in range(8):
                    e = 500.0 * (j.end - j.start)
                    rows.append(
                        (
                            str(j.job_id),
                            f"n{n}",
                            g,
                            j.start - j.start % DAY,
                            e,
                            float(j.end - j.start),
                            0.0,
                            float(j.start),
                            float(j.end),
                        )
                    )
            if len(rows) > 200_000:
                store.usage.add(rows, [])
                rows = []
        store.usage.add(rows, [])
        store.close()
        figures["observed_gpu_rows"] = sum(j.nodes * 8 for j in jobs)

        window = [time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(x)) for x in (start, end)]
        t = time.perf_counter()
        floor = subprocess.run(
            ["sacct", "-a", "-X", "-D", "-P", "-n", "-S", window[0], "-E", window[1], "-o", "JobIDRaw"],
            env=c.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        figures["floor_sacct_jobid_s"] = round(time.perf_counter() - t, 2)
        figures["floor_rows"] = len(floor.stdout.splitlines())

        t = time.perf_counter()
        acct = SlurmAccounting(env=c.env, timeout_s=600).fetch(start, end)
        figures["fetch_s"] = round(time.perf_counter() - t, 2)
        assert acct.available, acct.why
        figures["records"] = len(acct.jobs)

        t = time.perf_counter()
        st = Store.open(Path(tmp) / "state.db")
        observed = load_observed(st, start, end)
        st.close()
        figures["observed_s"] = round(time.perf_counter() - t, 2)

        t = time.perf_counter()
        total = sum(j.gpus * ((j.end or end) - (j.start or end)) for j in acct.jobs)
        figures["floor_one_pass_s"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        report = build_report(acct, observed, start=start, end=end, now=end, by=("account",))
        figures["build_by_account_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        build_report(acct, observed, start=start, end=end, now=end, by=("account", "user", "partition"))
        figures["build_by_account_user_partition_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        for render in (to_table, to_csv, to_json, to_html):
            render(report)
        figures["render_all_s"] = round(time.perf_counter() - t, 3)
        figures["gpu_hours"] = round(report.total_gpu_hours)
        figures["gpu_hours_check"] = round(total / 3600)
        figures["report_total_s"] = round(
            float(figures["fetch_s"])
            + float(figures["observed_s"])
            + float(figures["build_by_account_s"])  # type: ignore[arg-type]
            + float(figures["render_all_s"]),  # type: ignore[arg-type]
            2,
        )
        figures["ratio_fetch_to_sacct_floor"] = round(
            float(figures["fetch_s"]) / max(1e-3, float(figures["floor_sacct_jobid_s"])),
            2,  # type: ignore[arg-type]
        )
    for k, v in figures.items():
        print(f"{k:40s} {v}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
