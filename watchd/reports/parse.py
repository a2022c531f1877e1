"""Parsers for the Slurm commands the accounting source runs (pure text -> records).

Times come as epoch seconds: the source runs the commands with ``SLURM_TIME_FORMAT=%s``. A line that does
not parse is skipped and counted (returned with the records), never a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from watchd.reports.model import JobRecord, PendingJob, ShareRecord

SACCT_FIELDS = "JobIDRaw,Account,User,Partition,Submit,Start,End,State,AllocTRES,NodeList"
SSHARE_FIELDS = "Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare,LevelFS"
#: squeue -O fields for pending jobs ("|" after each, so free text never splits a row)
SQUEUE_FORMAT = (
    "JobID:|,Account:|,UserName:|,Partition:|,SubmitTime:|,Reason:|,NumNodes:|,tres-per-node:|,tres-per-job:|"
)

_GPU_TRES = re.compile(r"gres[/:]gpu(?::[^=:,]+)?[=:](\d+)")


def _epoch(text: str) -> float | None:
    text = text.strip()
    if not text or not text.lstrip("-").isdigit():
        return None  # Unknown, None, N/A
    value = float(text)
    return value if value > 0 else None


def _float(text: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def gpus_of_tres(tres: str) -> int:
    """GPUs in a TRES string: ``gres/gpu=4`` (typed ``gres/gpu:a100=4`` counted when no untyped entry)."""
    untyped = re.search(r"gres/gpu=(\d+)", tres)
    if untyped:
        return int(untyped.group(1))
    return sum(int(m.group(1)) for m in _GPU_TRES.finditer(tres))


def parse_sacct(text: str, expand: Callable[[str], list[str]]) -> tuple[list[JobRecord], int]:
    """``sacct -P -n --format=SACCT_FIELDS`` -> records and the count of lines that did not parse."""
    out: list[JobRecord] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) != 10:
            bad += 1
            continue
        submit = _epoch(f[4])
        if submit is None or not f[0]:
            bad += 1
            continue
        nodes = f[9].strip()
        try:
            node_list = tuple(expand(nodes)) if nodes and nodes not in ("None assigned", "(null)") else ()
        except ValueError:
            node_list = ()
        out.append(
            JobRecord(
                job_id=f[0],
                account=f[1],
                user=f[2],
                partition=f[3],
                gpus=gpus_of_tres(f[8]),
                submit=submit,
                start=_epoch(f[5]),
                end=_epoch(f[6]),
                state=f[7].split(" ", 1)[0],
                nodes=node_list,
            )
        )
    return out, bad


def parse_sshare(text: str) -> tuple[list[ShareRecord], int]:
    """``sshare -a -P -n -o SSHARE_FIELDS`` -> associations (the root rows are left out)."""
    out: list[ShareRecord] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) != 8:
            bad += 1
            continue
        account = f[0].strip()
        user = f[1].strip() or None
        if not account or account == "root":
            continue
        raw = f[2].strip()
        out.append(
            ShareRecord(
                account=account,
                user=user,
                raw_shares=int(raw) if raw.isdigit() else None,
                norm_shares=_float(f[3]),
                raw_usage=_float(f[4]),
                effective_usage=_float(f[5]),
                fairshare=_float(f[6]),
                level_fs=_float(f[7]),
            )
        )
    return out, bad


def parse_squeue_pending(text: str) -> tuple[list[PendingJob], int]:
    """``squeue -h -t PD -O SQUEUE_FORMAT`` -> pending jobs."""
    out: list[PendingJob] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        f = [x.strip() for x in line.split("|")]
        if len(f) < 9:
            bad += 1
            continue
        submit = _epoch(f[4])
        if submit is None:
            bad += 1
            continue
        nodes = int(f[6]) if f[6].isdigit() else 1
        per_node = gpus_of_tres(f[7]) if f[7] not in ("", "N/A", "(null)") else 0
        per_job = gpus_of_tres(f[8]) if f[8] not in ("", "N/A", "(null)") else 0
        out.append(
            PendingJob(
                job_id=f[0],
                account=f[1],
                user=f[2],
                partition=f[3],
                gpus=per_job or per_node * nodes,
                submit=submit,
                reason=f[5],
            )
        )
    return out, bad
