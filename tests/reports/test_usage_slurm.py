"""The usage report against a real Slurm cluster with accounting: jobs of known sizes and durations under
three accounts, two of them held behind others, compared with what ``sacct --json``, ``squeue --json`` and
``sshare`` say for the same window."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.harness.slurm import SlurmCluster
from watchd.reports.core import build_report, percentile
from watchd.reports.model import Observed
from watchd.reports.render import to_csv, to_json, to_markdown, to_table
from watchd.reports.source import SlurmAccounting

pytestmark = [pytest.mark.slurm]


def _submit(c: SlurmCluster, account: str, gpus: int, seconds: float, *extra: str) -> str:
    nodes = 2 if gpus > 4 else 1
    return c.submit(
        f"sleep {seconds}",
        nodes=nodes,
        requeue=False,
        extra_args=[f"--account={account}", f"--gpus={gpus}", *extra],
    )


def _sacct_json(c: SlurmCluster, start: float) -> list[dict[str, object]]:
    res = c.run(
        "sacct", "--json", "-a", "-X", "-S", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start))
    )
    jobs: list[dict[str, object]] = json.loads(res.stdout)["jobs"]
    return jobs


def _gpus(job: dict[str, object]) -> int:
    tres = job["tres"]
    assert isinstance(tres, dict)
    return sum(int(t["count"]) for t in tres["allocated"] if t["type"] == "gres" and t["name"] == "gpu")


def _wait_sacct(c: SlurmCluster, states: dict[str, str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        out = c.run("sacct", "-n", "-X", "-P", "-o", "JobIDRaw,State", "-j", ",".join(states)).stdout
        got = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        if all(got.get(j) == s for j, s in states.items()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"sacct never showed {states}: {got}")
        time.sleep(0.3)


def _shares(sshare: str) -> list[tuple[str, ...]]:
    """The columns the report takes from sshare, row by row."""
    lines = [line.split("|") for line in sshare.splitlines()]
    cols = [lines[0].index(name) for name in ("Account", "User", "NormShares", "RawUsage", "FairShare")]
    return [tuple(f[i] for i in cols) for f in lines[1:]]


@pytest.fixture(scope="module")
def scenario(acct_cluster: SlurmCluster) -> dict[str, object]:
    c = acct_cluster
    t0 = time.time() - 1
    # all 8 GPUs for 3 s, so the next three wait for it (Resources)
    big = _submit(c, "teama", 8, 3)
    c.wait_job_running(big)
    b1 = _submit(c, "teamb", 2, 2)
    c1 = _submit(c, "teamc", 4, 1)
    b2 = c.submit(
        "sleep 1", nodes=1, requeue=False, extra_args=["--account=teamb", "--gpus=1", "--uid=daemon"]
    )
    held = _submit(c, "teamc", 1, 1, "--hold")
    for job in (big, b1, c1, b2):
        c.wait_job_state(job, ["COMPLETED"], timeout=60)
    # a long job on every GPU and one more job held behind it
    long = _submit(c, "teama", 8, 600)
    c.wait_job_running(long)
    behind = _submit(c, "teamb", 1, 1)
    deadline = time.monotonic() + 20
    while c.job(behind).get("Reason") in (None, "None") and time.monotonic() < deadline:
        time.sleep(0.2)
    # slurmctld tells slurmdbd about starts and ends asynchronously: wait until sacct has them
    _wait_sacct(c, {big: "COMPLETED", b1: "COMPLETED", c1: "COMPLETED", b2: "COMPLETED", long: "RUNNING"})
    # slurmctld recomputes fair-share factors once a PriorityCalcPeriod (a minute here): read sshare before
    # and after the fetch and take a fetch that no recomputation fell inside
    for _ in range(3):
        before = _shares(c.run("sshare", "-a", "-P", "-l").stdout)
        now = time.time()
        acct = SlurmAccounting(env=c.env).fetch(t0, now + 1)
        sshare = c.run("sshare", "-a", "-P", "-l").stdout
        if _shares(sshare) == before:
            break
    else:
        raise AssertionError("sshare changed across every fetch")
    sacct = _sacct_json(c, t0)
    squeue = json.loads(c.run("squeue", "--json", "-a", "-t", "PD").stdout)["jobs"]
    report = build_report(acct, Observed(), start=t0, end=now + 1, now=now, by=("account",))
    by_user = build_report(acct, Observed(), start=t0, end=now + 1, now=now, by=("account", "user"))
    c.cancel(long, behind, held)
    return {
        "acct": acct,
        "report": report,
        "by_user": by_user,
        "sacct": sacct,
        "squeue": squeue,
        "sshare": sshare,
        "now": now,
        "ids": {"big": big, "b1": b1, "c1": c1, "b2": b2, "held": held, "long": long, "behind": behind},
    }


def test_accounting_is_available_and_every_run_is_there(scenario: dict[str, object]) -> None:
    acct = scenario["acct"]
    ids = scenario["ids"]
    assert isinstance(ids, dict)
    assert acct.available, acct.why  # type: ignore[attr-defined]
    got = {j.job_id: j for j in acct.jobs}  # type: ignore[attr-defined]
    for name in ("big", "b1", "c1", "b2", "long"):
        assert ids[name] in got, name
    assert got[ids["big"]].gpus == 8 and got[ids["big"]].nodes == ("gpu-1", "gpu-2")
    assert got[ids["b2"]].user == "daemon" and got[ids["b2"]].account == "teamb"
    assert got[ids["long"]].end is None  # still running


def test_gpu_hours_per_account_match_sacct_json(scenario: dict[str, object]) -> None:
    report, sacct, now = scenario["report"], scenario["sacct"], scenario["now"]
    assert isinstance(sacct, list) and isinstance(now, float)
    expected: dict[str, float] = {}
    for job in sacct:
        t = job["time"]
        assert isinstance(t, dict)
        if not t["start"]:
            continue
        end = t["end"] if t["end"] and job["state"]["current"] != "RUNNING" else now  # type: ignore[index]
        expected[str(job["account"])] = (
            expected.get(str(job["account"]), 0.0) + _gpus(job) * (end - t["start"]) / 3600
        )
    rows = {r.key["account"]: r for r in report.rows}  # type: ignore[attr-defined]
    assert set(expected) == {"teama", "teamb", "teamc"}
    for account, hours in expected.items():
        # the running job's end is "now" on both sides, taken a moment apart: 8 GPUs x 2 s
        assert rows[account].gpu_hours == pytest.approx(hours, abs=8 * 2 / 3600), account
    # the known sizes: teamb ran 2 GPUs x 2 s and 1 GPU x 1 s; teamc 4 GPUs x 1 s
    assert 5 / 3600 <= rows["teamb"].gpu_hours <= 9 / 3600
    assert 4 / 3600 <= rows["teamc"].gpu_hours <= 8 / 3600
    assert rows["teama"].gpu_hours >= 8 * 3 / 3600
    assert sum(r.usage_fraction for r in rows.values()) == pytest.approx(1.0)


def test_queue_waits_match_sacct_json(scenario: dict[str, object]) -> None:
    report, sacct = scenario["report"], scenario["sacct"]
    assert isinstance(sacct, list)
    waits: dict[str, list[float]] = {}
    for job in sacct:
        t = job["time"]
        if t["start"]:  # type: ignore[index]
            waits.setdefault(str(job["account"]), []).append(float(t["start"] - t["submission"]))  # type: ignore[index]
    rows = {r.key["account"]: r for r in report.rows}  # type: ignore[attr-defined]
    for account, values in waits.items():
        values.sort()
        r = rows[account]
        assert r.waits_n == len(values)
        assert r.wait_p50_s == pytest.approx(percentile(values, 0.5), abs=1)
        assert r.wait_p95_s == pytest.approx(percentile(values, 0.95), abs=1)
        assert r.wait_max_s == pytest.approx(values[-1], abs=1)
    # teamb's first job waited behind the 3 s job on every GPU
    assert rows["teamb"].wait_max_s is not None and rows["teamb"].wait_max_s >= 2


def test_pending_jobs_and_reasons_match_squeue_json(scenario: dict[str, object]) -> None:
    report, squeue, ids = scenario["report"], scenario["squeue"], scenario["ids"]
    assert isinstance(squeue, list) and isinstance(ids, dict)
    # squeue --json (22.05) ignores -t: keep the pending ones here
    expected = {
        str(j["job_id"]): (j["account"], j["state_reason"]) for j in squeue if j["job_state"] == "PENDING"
    }
    got = {p.job_id: (p.account, p.reason) for p in report.pending}  # type: ignore[attr-defined]
    assert got == expected
    assert got[ids["held"]] == ("teamc", "JobHeldUser")
    assert got[ids["behind"]][0] == "teamb" and got[ids["behind"]][1] in ("Resources", "Priority")
    rows = {r.key["account"]: r for r in report.rows}  # type: ignore[attr-defined]
    assert rows["teamc"].pending == 1 and rows["teamc"].pending_reasons == {"JobHeldUser": 1}
    assert rows["teamb"].pending == 1 and rows["teamb"].pending_gpus == 1
    assert rows["teamc"].pending_wait_max_s is not None and rows["teamc"].pending_wait_max_s > 1


def test_shares_match_sshare(scenario: dict[str, object]) -> None:
    report, by_user, text = scenario["report"], scenario["by_user"], scenario["sshare"]
    assert isinstance(text, str)
    lines = [line.split("|") for line in text.splitlines()]
    head = lines[0]
    accounts = {f[0].strip(): dict(zip(head, f, strict=True)) for f in lines[1:] if not f[1].strip()}
    users = {(f[0].strip(), f[1]): dict(zip(head, f, strict=True)) for f in lines[1:] if f[1].strip()}
    rows = {r.key["account"]: r for r in report.rows}  # type: ignore[attr-defined]
    for account in ("teama", "teamb", "teamc"):
        assert rows[account].norm_shares == pytest.approx(float(accounts[account]["NormShares"]))
    assert rows["teama"].norm_shares == pytest.approx(30 / 46, abs=1e-3)  # 30 of 30+10+5+root's 1
    user_rows = {(r.key["account"], r.key["user"]): r for r in by_user.rows}  # type: ignore[attr-defined]
    assert user_rows[("teamb", "daemon")].fairshare == pytest.approx(
        float(users[("teamb", "daemon")]["FairShare"])
    )
    # fair-share billing is the GPU count (TRESBillingWeights=GRES/gpu=1): RawUsage ~ GPU-seconds of the
    # finished runs (a 7-day half-life decays nothing in a minute)
    for account in ("teamb", "teamc"):
        assert float(accounts[account]["RawUsage"]) == pytest.approx(rows[account].gpu_hours * 3600, abs=3)


def test_every_format_carries_the_rows(scenario: dict[str, object]) -> None:
    report = scenario["report"]
    table = to_table(report)  # type: ignore[arg-type]
    assert "teama" in table and "Slurm accounting" in table
    csv_text = to_csv(report)  # type: ignore[arg-type]
    assert csv_text.splitlines()[0].startswith("account,gpu_hours,")
    assert len(csv_text.splitlines()) == 4
    doc = json.loads(to_json(report))  # type: ignore[arg-type]
    assert {r["key"]["account"] for r in doc["rows"]} == {"teama", "teamb", "teamc"}
    assert "| teamb |" in to_markdown(report)  # type: ignore[arg-type]


def test_cli_against_the_cluster(acct_cluster: SlurmCluster, scenario: dict[str, object]) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "watchd",
            "report",
            "usage",
            "--since",
            "1h",
            "--by",
            "account,partition",
            "--format",
            "csv",
        ],
        env=acct_cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("account,partition,gpu_hours")
    assert {line.split(",")[0] for line in lines[1:]} >= {"teama", "teamb", "teamc"}
