"""The pure report: clipping to the window, waits, pending, shares, lost work (checkpoints, requeues,
node failures, drains), the fallback without accounting, the ledger, the renderers and the metrics."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest

from watchd.cli import main
from watchd.model.events import Event
from watchd.reports.core import build_report, percentile
from watchd.reports.ledger import UsageLedger
from watchd.reports.metrics import OTHER, families, to_prometheus
from watchd.reports.model import Accounting, Fault, GpuUse, JobRecord, Observed, PendingJob, ShareRecord
from watchd.reports.observed import load_observed
from watchd.reports.parse import gpus_of_tres, parse_sacct, parse_squeue_pending, parse_sshare
from watchd.reports.render import to_csv, to_json, to_markdown, to_table
from watchd.reports.source import FakeAccounting
from watchd.store.database import Store

H = 3600.0
T = 1_800_000_000.0  # window [T, T + 10 h)


def job(
    jid: str,
    account: str,
    gpus: int,
    submit: float,
    start: float | None,
    end: float | None,
    state: str = "COMPLETED",
    user: str = "u",
    partition: str = "gpu",
    nodes: tuple[str, ...] = ("n1",),
) -> JobRecord:
    return JobRecord(jid, account, user, partition, gpus, submit, start, end, state, nodes)


def report(acct: Accounting, observed: Observed | None = None, **kw: object) -> object:
    return build_report(acct, observed or Observed(), start=T, end=T + 10 * H, now=T + 10 * H, **kw)  # type: ignore[arg-type]


def rows(rep: object) -> dict[str, object]:
    return {"/".join(r.key.values()): r for r in rep.rows}  # type: ignore[attr-defined]


def test_gpu_hours_are_clipped_to_the_window_and_running_jobs_count_to_now() -> None:
    acct = Accounting(
        True,
        jobs=(
            job("1", "a", 4, T - 3 * H, T - 2 * H, T + 1 * H),  # 1 h inside
            job("2", "a", 2, T, T + 9 * H, None, state="RUNNING"),  # 1 h to now
            job("3", "b", 8, T, T + 1 * H, T + 3 * H),  # 2 h
            job("4", "b", 8, T - 9 * H, T - 8 * H, T - 7 * H),  # before the window
        ),
    )
    r = rows(report(acct))
    assert r["a"].gpu_hours == pytest.approx(4 + 2)  # type: ignore[attr-defined]
    assert r["b"].gpu_hours == pytest.approx(16)  # type: ignore[attr-defined]
    assert r["a"].jobs == 1 and r["b"].jobs == 1  # runs that started in the window  # type: ignore[attr-defined]
    assert r["a"].usage_fraction == pytest.approx(6 / 22)  # type: ignore[attr-defined]


def test_series_sum_to_the_gpu_hours() -> None:
    acct = Accounting(True, jobs=(job("1", "a", 4, T, T + 0.5 * H, T + 7.25 * H),))
    rep = report(acct, buckets=10)
    assert sum(rep.series["a"]) == pytest.approx(4 * 6.75)  # type: ignore[attr-defined]


def test_waits_percentiles_and_pending() -> None:
    jobs = tuple(job(str(i), "a", 1, T, T + i * 60, T + i * 60 + 10) for i in range(1, 21))
    pending = (
        PendingJob("90", "a", "u", "gpu", 8, T + 8 * H, "Resources"),
        PendingJob("91", "a", "u", "gpu", 2, T + 9 * H, "Priority"),
        PendingJob("92", "c", "u", "gpu", 1, T + 5 * H, "JobHeldUser"),
    )
    r = rows(report(Accounting(True, jobs=jobs, pending=pending)))
    a = r["a"]
    assert (a.waits_n, a.wait_p50_s, a.wait_p95_s, a.wait_max_s) == (20, 600, 1140, 1200)  # type: ignore[attr-defined]
    assert (a.pending, a.pending_gpus, a.pending_wait_max_s) == (2, 10, 2 * H)  # type: ignore[attr-defined]
    assert a.pending_reasons == {"Resources": 1, "Priority": 1}  # type: ignore[attr-defined]
    assert r["c"].gpu_hours == 0 and r["c"].pending == 1  # type: ignore[attr-defined]
    assert percentile([], 0.5) is None and percentile([3.0], 0.95) == 3.0


def test_shares_for_accounts_and_users() -> None:
    shares = (
        ShareRecord("a", None, 30, 0.75, 100.0, 0.6, None, 1.25),
        ShareRecord("a", "u", 1, 0.5, 50.0, 0.3, 0.8, 1.0),
        ShareRecord("a", "v", 1, 0.5, 50.0, 0.3, 0.4, 1.0),
    )
    acct = Accounting(
        True, jobs=(job("1", "a", 1, T, T, T + H), job("2", "a", 1, T, T, T + H, user="v")), shares=shares
    )
    a = rows(report(acct))["a"]
    assert (a.norm_shares, a.effective_usage, a.level_fs) == (0.75, 0.6, 1.25)  # type: ignore[attr-defined]
    assert a.fairshare == pytest.approx(0.6)  # the mean of its users'  # type: ignore[attr-defined]
    per_user = rows(report(acct, by=("account", "user")))
    assert per_user["a/v"].fairshare == 0.4 and per_user["a/v"].norm_shares == 0.5  # type: ignore[attr-defined]
    assert rows(report(acct, by=("partition",)))["gpu"].norm_shares is None  # type: ignore[attr-defined]


def test_lost_work_since_checkpoint_start_or_requeue_with_evidence_only() -> None:
    jobs = (
        # watchd requeued 1 at T+2h; its last checkpoint inside the run was at T+1.5h: 0.5 h x 8 GPUs lost
        job("1", "a", 8, T, T, T + 2 * H, state="REQUEUED"),
        # Slurm says the node failed; no checkpoint: since the start, 1 h x 4
        job("2", "b", 4, T, T + 3 * H, T + 4 * H, state="NODE_FAIL"),
        # failed on a node watchd drained while it ran: since the start, 2 h x 2
        job("3", "b", 2, T, T + 4 * H, T + 6 * H, state="FAILED", nodes=("n7",)),
        # failed with no infrastructure evidence: nothing lost to infrastructure
        job("4", "b", 2, T, T + 4 * H, T + 6 * H, state="FAILED", nodes=("n8",)),
        # completed on a drained node: drained after, ended fine
        job("5", "c", 2, T, T + 4 * H, T + 6 * H, nodes=("n7",)),
    )
    observed = Observed(
        checkpoints={"1": (T - H, T + 1.5 * H, T + 5 * H), "2": (T + 2 * H,)},
        faults=(
            Fault("n1", T + 2 * H, "requeue", ("1",)),
            Fault("n7", T + 5 * H, "drain"),
        ),
    )
    rep = report(Accounting(True, jobs=jobs), observed)
    lost = {lj.job_id: lj for lj in rep.lost_jobs}  # type: ignore[attr-defined]
    assert set(lost) == {"1", "2", "3"}
    assert (lost["1"].evidence, lost["1"].since_what, lost["1"].gpu_hours) == ("requeue", "checkpoint", 4.0)
    assert (lost["2"].evidence, lost["2"].since_what, lost["2"].gpu_hours) == ("node_fail", "start", 4.0)
    assert (lost["3"].evidence, lost["3"].gpu_hours) == ("drain", 4.0)
    r = rows(rep)
    assert r["a"].lost_gpu_hours == 4.0 and r["b"].lost_gpu_hours == 8.0 and r["b"].lost_jobs == 2  # type: ignore[attr-defined]


def test_without_accounting_the_observed_usage_is_reported() -> None:
    observed = Observed(
        gpus=(
            GpuUse("slurm-7", "n1", 0, 3.6e6, 7200.0, 3600.0, T, T + 2 * H, account="a"),
            GpuUse("k8s:ns/j", "n2", 0, 1.8e6, 3600.0, 0.0, T + H, T + 2 * H),
        )
    )
    acct = FakeAccounting(available=False, why="sacct: Slurm accounting storage is disabled").fetch(
        T, T + 10 * H
    )
    rep = report(acct, observed)
    assert rep.accounting is False  # type: ignore[attr-defined]
    r = rows(rep)
    assert r["a"].energy_kwh == pytest.approx(1.0) and r["a"].idle_gpu_hours == pytest.approx(1.0)  # type: ignore[attr-defined]
    assert r["(unknown)"].observed_gpu_hours == pytest.approx(1.0)  # type: ignore[attr-defined]
    assert "NO ACCOUNTING" in to_table(rep) and "storage is disabled" in to_table(rep)  # type: ignore[arg-type]


def test_observed_span_partly_in_the_window_counts_in_proportion() -> None:
    observed = Observed(gpus=(GpuUse("1", "n1", 0, 3.6e6, 4 * H, 0.0, T - 2 * H, T + 2 * H),))
    r = rows(report(Accounting(True, jobs=(job("1", "a", 1, T - 3 * H, T - 2 * H, T + 2 * H),)), observed))
    assert r["a"].energy_kwh == pytest.approx(0.5)  # type: ignore[attr-defined]


def test_bad_group_and_empty_window_are_errors() -> None:
    with pytest.raises(ValueError, match="cannot group by"):
        report(Accounting(True), by=("team",))
    with pytest.raises(ValueError, match="empty"):
        build_report(Accounting(True), Observed(), start=T, end=T, now=T)


# ----------------------------------------------------------------------------- parsers


def test_parsers_skip_what_does_not_parse() -> None:
    sacct = (
        "1|a|u|gpu|100|110|200|COMPLETED|billing=8,cpu=2,gres/gpu=8,node=2|n[1-2]\n"
        "2|a|u|gpu|100|Unknown|Unknown|PENDING||None assigned\n"
        "3|b|u|gpu|100|110|Unknown|CANCELLED by 0|cpu=1,gres/gpu:a100=2|n3\n"
        "garbage\n"
        "4|a|u|gpu|notatime|1|2|X||n1\n"
    )
    from watchd.integrations.slurm.scheduler import expand_hostlist

    recs, bad = parse_sacct(sacct, expand_hostlist)
    assert bad == 2
    assert [(r.job_id, r.gpus, r.start, r.end, r.state, r.nodes) for r in recs] == [
        ("1", 8, 110.0, 200.0, "COMPLETED", ("n1", "n2")),
        ("2", 0, None, None, "PENDING", ()),
        ("3", 2, 110.0, None, "CANCELLED", ("n3",)),
    ]
    shares, bad = parse_sshare(
        "root|||0.000000|25|1.000000||\n teama||30|0.731707|23|0.5||inf\n"
        "  teama|root|1|1.0|23|0.5|0.25|0.7\nx|y\n"
    )
    assert bad == 1
    assert shares[0].user is None and shares[0].level_fs == float("inf") and shares[1].fairshare == 0.25
    pend, bad = parse_squeue_pending("7|teamb|root|gpu|1796410699|Resources|2|gres:gpu:2|N/A|\n8|x\n")
    assert bad == 1 and pend[0].gpus == 4 and pend[0].reason == "Resources"
    assert gpus_of_tres("cpu=4,gres/gpu=4,gres/gpu:h100=4") == 4


# ----------------------------------------------------------------------------- ledger and store


def _summary(job: str | None, gpu: int, t: float, power: float, util: float, node: str = "n1") -> Event:
    attrs: dict[str, object] = {"gpu": gpu, "window_s": 5.0, "window_start": t - 5, "power_mean": power}
    attrs["util_mean"] = util
    if job is not None:
        attrs["job"] = job
    return Event(id=f"{node}{gpu}{t}", node=node, source="nvml", kind="gpu_summary", time=t, attrs=attrs)  # type: ignore[arg-type]


def _heartbeat(job: str, rank: int, t: float, phase: str) -> Event:
    attrs = {"job": job, "rank": rank, "step": 1, "phase": phase}
    return Event(id=f"hb{rank}{t}", node="n1", source="heartbeat", kind="heartbeat", time=t, attrs=attrs)  # type: ignore[arg-type]


def test_ledger_accumulates_per_job_gpu_day_and_records_checkpoints() -> None:
    ledger = UsageLedger(idle_util_pct=5.0)
    for k in range(1, 5):
        ledger.observe(_summary("slurm:42", 0, T + 5 * k, 500.0, 90.0 if k < 3 else 1.0))
    ledger.observe(_summary(None, 1, T + 5, 100.0, 0.0))  # no job: not usage of anyone
    ledger.observe(_heartbeat("slurm:42", 0, T + 100, "checkpoint"))
    ledger.observe(_heartbeat("slurm:42", 0, T + 130, "checkpoint"))
    ledger.observe(_heartbeat("slurm:42", 1, T + 100, "checkpoint"))
    ledger.observe(_heartbeat("slurm:42", 0, T + 160, "train"))
    ledger.observe(_heartbeat("slurm:42", 1, T + 160, "train"))
    gpus, cps = ledger.take()
    assert len(gpus) == 1 and ledger.skipped == 1
    d = gpus[0]
    assert (d.job, d.energy_j, d.gpu_s, d.idle_s, d.first, d.last) == ("42", 10_000.0, 20.0, 10.0, T, T + 20)
    assert cps == [("42", T + 100)]
    assert ledger.take() == ([], [])

    store = Store.open(":memory:")
    row = (d.job, d.node, d.gpu, d.day, d.energy_j, d.gpu_s, d.idle_s, d.first, d.last)
    store.usage.add([row], cps)
    store.usage.add([row], [])  # a second flush of the same GPU-day adds up
    [(j, _, _, e, s, i, first, last)] = store.usage.gpu_rows(T - H, T + H)
    assert (j, e, s, i, first, last) == ("42", 20_000.0, 40.0, 20.0, T, T + 20)
    assert store.usage.checkpoints() == {"42": (T + 100,)}
    assert store.usage.gpu_rows(T + 2 * H, T + 3 * H) == []
    assert store.usage.prune(T + H) == 2
    assert store.usage.gpu_rows(T - H, T + H) == []


def test_faults_come_from_watchd_s_audit(tmp_path: Path) -> None:
    from watchd.actions.audit import AuditRecord

    store = Store.open(tmp_path / "state.db")
    base = {"rule": "r", "event_id": "e", "mode": "enforce", "duration_s": 0.0, "params": {}}
    store.audit.append(
        AuditRecord(
            time=T, node="n1", action="requeue", outcome="requeued", detail="requeued slurm:5,6", **base
        )
    )  # type: ignore[arg-type]
    store.audit.append(AuditRecord(time=T, node="n2", action="drain", outcome="drained", detail="", **base))  # type: ignore[arg-type]
    store.audit.append(AuditRecord(time=T, node="n3", action="drain", outcome="dry_run", detail="", **base))  # type: ignore[arg-type]
    faults = load_observed(store, T - H, T + H).faults
    assert sorted((f.node, f.kind, f.jobs) for f in faults) == [
        ("n1", "requeue", ("5", "6")),
        ("n2", "drain", ()),
    ]


# ----------------------------------------------------------------------------- outputs


def _sample() -> object:
    jobs = (
        job("1", "a,b|c", 4, T, T + 60, T + H),
        job("2", "b", 2, T, T + 120, T + 2 * H, partition="big"),
    )
    return report(
        Accounting(True, jobs=jobs, shares=(ShareRecord("b", None, 1, 0.5, 1.0, 0.1, None, float("inf")),))
    )


def test_csv_markdown_json_keep_awkward_names() -> None:
    rep = _sample()
    parsed = list(csv.reader(io.StringIO(to_csv(rep))))  # type: ignore[arg-type]
    assert parsed[0][:3] == ["account", "gpu_hours", "usage_pct"]
    assert parsed[1][0] == "a,b|c" and float(parsed[1][1]) == pytest.approx(4 * (H - 60) / H)
    assert "a,b\\|c" in to_markdown(rep)  # type: ignore[arg-type]
    doc = json.loads(to_json(rep))  # type: ignore[arg-type]
    assert doc["rows"][1]["level_fs"] is None  # inf is not JSON


def test_metrics_are_bounded_and_valid_for_promtool(promtool: str) -> None:
    jobs = tuple(job(str(i), f"acct{i:02d}", 1, T, T, T + (i + 1) * 60) for i in range(30))
    rep = build_report(
        Accounting(True, jobs=jobs),
        Observed(),
        start=T,
        end=T + 10 * H,
        now=T + 10 * H,
        by=("account", "partition"),
    )
    fams = {f.name: f for f in families(rep, max_accounts=5)}
    accounts = {s.labels["account"] for s in fams["watchd_usage_gpu_seconds"].samples}
    assert accounts == {"acct29", "acct28", "acct27", "acct26", "acct25", OTHER}
    total = sum(s.value for s in fams["watchd_usage_gpu_seconds"].samples)
    assert total == pytest.approx(rep.total_gpu_hours * 3600)
    assert all("user" not in s.labels and "job" not in s.labels for f in fams.values() for s in f.samples)
    text = to_prometheus(rep, max_accounts=5)
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_cli_with_the_fake_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    now = time.time()
    fixture = tmp_path / "acct.json"
    fixture.write_text(
        json.dumps(
            {
                "jobs": [
                    {
                        "job_id": "1",
                        "account": "a",
                        "user": "u",
                        "partition": "gpu",
                        "gpus": 2,
                        "submit": now - 7200,
                        "start": now - 7000,
                        "end": now - 3400,
                        "state": "COMPLETED",
                    }
                ],
                "pending": [
                    {
                        "job_id": "2",
                        "account": "b",
                        "user": "u",
                        "partition": "gpu",
                        "gpus": 1,
                        "submit": now - 100,
                        "reason": "Priority",
                    }
                ],
            }
        )
    )
    assert main(["report", "usage", "--source", "fake", "--fixture", str(fixture), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["key"]["account"]: round(r["gpu_hours"], 3) for r in doc["rows"]} == {"a": 2.0, "b": 0.0}
    assert main(["report", "usage", "--source", "fake", "--fixture", str(fixture), "--by", "team"]) == 2
    assert "--by 'team'" in capsys.readouterr().err
    assert main(["report", "usage", "--source", "fake", "--fixture", str(fixture), "--since", "soon"]) == 2
    assert main(["report", "usage", "--source", "fake", "--fixture", str(tmp_path / "nope.json")]) == 2
    assert main(["report", "usage", "--source", "none", "--state", str(tmp_path / "none.db")]) == 2
    out = tmp_path / "r.html"
    assert (
        main(
            [
                "report",
                "usage",
                "--source",
                "fake",
                "--fixture",
                str(fixture),
                "--format",
                "html",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert out.read_text().startswith("<!DOCTYPE html>")
