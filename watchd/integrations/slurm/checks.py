"""Active checks on Slurm: each check is a batch job pinned to its node (``sbatch -w NODE
--exclusive``, the configured partition, QOS, reservation and account, a time limit), its output collected
from the job's output file, its end from ``scontrol show job``.

What "idle" means here (never a busy, drained, reserved or already-checking node): the node's state is
``IDLE`` with no flag (no ``DRAIN``, ``RESERVED``, ``COMPLETING``, ``PLANNED``, ``MAINT``, ``POWER*``,
``NOT_RESPONDING``...), ``squeue`` shows no job on it in any state that holds or is taking it (configuring,
running, completing, suspended), and no reservation holds it now or starts before the check would end.

Validation of a node watchd drained: Slurm never starts a job on a drained node, even inside a reservation
(checked on Slurm 22.05). So the node is first put in a maintenance reservation that admits only watchd's user
(``Flags=MAINT,IGNORE_JOBS``), then its drain is lifted: nothing but the checks can land there. Then the
reservation is deleted (passed) or the node drained again with the new evidence first (failed).

The output path must be readable by the engine: ``checks.output_dir`` on a file system the nodes share (the
node writes it, slurmctld's host need not), a folder only the engine's user can write
(:mod:`watchd.integrations.slurm.output_dir`, checked when the runner is built). Each output is bound to its
job (:mod:`watchd.integrations.slurm.check_output`: a secret line first, the engine's user's own regular
file) and read off the event loop; anything else is an ``error`` naming why. New functions only: the
scheduler adapter (:mod:`watchd.integrations.slurm.scheduler`) is reused for ``scontrol show node``, pools
and subprocesses, and validation's lifted drain and new drain are its verbs (``resume``, ``apply_drain``).
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import re
import secrets
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from watchd.checks.params import ChecksConfig
from watchd.checks.runner import Availability, CheckJob, JobHandle, JobStatus, RunnerError, RunOutput
from watchd.integrations.base import SchedulerError
from watchd.integrations.slurm.calls import count_call
from watchd.integrations.slurm.check_output import REFUSED, UNREADABLE, header, read_output, script
from watchd.integrations.slurm.output_dir import check_output_dir
from watchd.integrations.slurm.scheduler import SlurmScheduler
from watchd.model.hostlist import expand_hostlist
from watchd.model.nodes import ResumeResult, drain_reason, drained_by_watchd
from watchd.untrusted import FILE_IO

__all__ = ["SlurmCheckRunner", "parse_job", "parse_reservations", "runner_from_config"]

#: node state flags that still let a check start (none of them takes or reserves the node)
_HARMLESS_FLAGS = frozenset({"CLOUD", "DYNAMIC_NORM", "DYNAMIC_FUTURE"})
_HOLDING = "CONFIGURING,RUNNING,COMPLETING,SUSPENDED,STOPPED,RESIZING"
#: a pending job's reasons that can mean its node left service (then the node's state is read to be sure)
_NODE_GONE_REASONS = ("ReqNodeNotAvail", "NodeDown")
#: how often a pending multi-node check asks whether another job took one of its peers (one squeue)
PEER_CHECK_S = 5.0
_TERMINAL = {
    "COMPLETED": "completed",
    "FAILED": "failed",
    "OUT_OF_MEMORY": "failed",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "CANCELLED": "cancelled",
    "PREEMPTED": "cancelled",
    "NODE_FAIL": "node_fail",
    "BOOT_FAIL": "node_fail",
}
VALIDATION_PREFIX = "watchd-validate-"


def parse_job(line: str) -> dict[str, str]:
    """One ``scontrol show job -o`` line: the keys the runner reads (JobState, ExitCode, Reason, NodeList,
    RunTime, StdOut)."""
    out: dict[str, str] = {}
    for key in ("JobId", "JobState", "Reason", "ExitCode", "NodeList", "RunTime", "StdOut", "TimeLimit"):
        m = re.search(rf"(?:^| ){key}=(\S*)", line)
        if m is not None:
            out[key] = m.group(1)
    return out


def _slurm_time(value: str) -> float | None:
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def parse_reservations(text: str) -> list[dict[str, Any]]:
    """``scontrol show reservation -o``: name, nodes (expanded), start and end (Unix time, local time as
    Slurm prints it), state."""
    out = []
    for line in text.splitlines():
        m = re.match(r"ReservationName=(\S+)", line.strip())
        if m is None:
            continue
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        nodes = fields.get("Nodes", "")
        out.append(
            {
                "name": m.group(1),
                "nodes": set(expand_hostlist(nodes)) if nodes and nodes != "(null)" else set(),
                "start": _slurm_time(fields.get("StartTime", "")),
                "end": _slurm_time(fields.get("EndTime", "")),
                "state": fields.get("State", ""),
            }
        )
    return out


def _time_arg(seconds: float) -> str:
    """``--time`` in minutes (Slurm's granularity), at least one."""
    return str(max(1, math.ceil(seconds / 60)))


class SlurmCheckRunner:
    name = "slurm"

    def __init__(
        self,
        scheduler: SlurmScheduler,
        *,
        output_dir: Path,
        sbatch: str = "sbatch",
        scancel: str = "scancel",
        partition: str | None = None,
        qos: str | None = None,
        reservation: str | None = None,
        account: str | None = None,
        extra_args: Sequence[str] = (),
        poll_interval_s: float = 1.0,
        grace_s: float = 30.0,
        user: str = "root",
        max_output_bytes: int = 1024 * 1024,
        owner: int | None = None,
        read_timeout_s: float = 30.0,
    ) -> None:
        self.slurm = scheduler
        self.output_dir = output_dir
        self.sbatch = sbatch
        self.scancel = scancel
        self.partition = partition
        self.qos = qos
        self.reservation = reservation
        self.account = account
        self.extra_args = list(extra_args)
        self.poll_interval_s = poll_interval_s
        self.grace_s = grace_s
        self.user = user
        self.max_output_bytes = max_output_bytes
        #: whose outputs are taken: the jobs' user, the engine's (sbatch runs as it)
        self.owner = os.geteuid() if owner is None else owner
        self.read_timeout_s = read_timeout_s
        self.submissions: list[list[str]] = []  # every sbatch argv (tests assert them)

    async def _run(
        self, *argv: str, input: str | None = None, check: bool = True, private: bool = False
    ) -> tuple[int, str, str]:
        """``private``: files the command's jobs create (their outputs) are their user's alone (umask 077;
        sbatch hands its umask, or ``SLURM_UMASK``, to the job)."""
        env = {**os.environ, **self.slurm.env_extra}
        if private:
            env["SLURM_UMASK"] = "0077"
        count_call(argv[0])
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                umask=0o077 if private else -1,
            )
        except OSError as exc:
            raise RunnerError(f"{argv[0]}: cannot run: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if input is not None else None), self.slurm.timeout
            )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RunnerError(f"{' '.join(argv[:3])}: timed out after {self.slurm.timeout:g}s") from None
        rc = proc.returncode if proc.returncode is not None else -1
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        if check and rc != 0:
            raise RunnerError(f"{' '.join(argv[:3])}: exit status {rc}: {(stderr or stdout).strip()[:500]}")
        return rc, stdout, stderr

    # ------------------------------------------------------------------------------------------ protocol
    async def members(self, partitions: Sequence[str]) -> dict[str, list[str]]:
        try:
            pools = await self.slurm.pools()
        except SchedulerError as exc:
            raise RunnerError(str(exc)) from exc
        return {p: n for p, n in pools.items() if not partitions or p in partitions}

    async def availability(self, nodes: Sequence[str], within_s: float) -> dict[str, Availability]:
        if not nodes:
            return {}
        try:
            states = await self.slurm.node_states(nodes)
        except SchedulerError as exc:
            raise RunnerError(str(exc)) from exc
        _, jobs, _ = await self._run(self.slurm.squeue, "-h", "-t", _HOLDING, "-o", "%i|%N|%T")
        busy: dict[str, str] = {}
        for line in jobs.splitlines():
            job_id, _, rest = line.strip().partition("|")
            hosts, _, state = rest.partition("|")
            for h in expand_hostlist(hosts) if hosts else []:
                busy.setdefault(h, f"job {job_id} {state.lower()}")
        _, resv, _ = await self._run(self.slurm.scontrol, "show", "reservation", "-o", check=False)
        now = time.time()
        reserved: dict[str, str] = {}
        for r in parse_reservations(resv):
            starts = r["start"]
            if r["state"] == "ACTIVE" or (starts is not None and starts < now + within_s + self.grace_s):
                for h in r["nodes"]:
                    reserved.setdefault(h, f"reserved ({r['name']})")
        pools = await self.members(())
        parts: dict[str, list[str]] = {}
        for p, members in pools.items():
            for m in members:
                parts.setdefault(m, []).append(p)
        out: dict[str, Availability] = {}
        for name in nodes:
            st = states.get(name)
            if st is None:
                continue
            flags = set(st.flags) - _HARMLESS_FLAGS
            why = ""
            if st.drained:
                why = f"drained ({st.reason or 'no reason'})"
            elif st.state != "idle":
                why = f"node is {st.state}" + (f"+{'+'.join(sorted(flags))}" if flags else "")
            elif flags:
                why = f"node is idle+{'+'.join(sorted(flags))}"
            elif name in busy:
                why = busy[name]
            elif name in reserved:
                why = reserved[name]
            out[name] = Availability(
                idle=not why,
                why=why,
                partitions=tuple(parts.get(name, ())),
                drained_by_watchd=drained_by_watchd(st),
            )
        return out

    def _argv(self, job: CheckJob, output: Path) -> list[str]:
        argv = [
            self.sbatch,
            "--parsable",
            f"--job-name=watchd-check-{job.check}",
            "-w",
            ",".join(job.nodes),
            "-N",
            str(len(job.nodes)),
            "--exclusive",
            "--no-requeue",
            f"--time={_time_arg(job.time_limit_s)}",
            f"--output={output}",
            f"--chdir={self.output_dir}",
        ]
        partition = self.partition or job.partition
        if partition and not job.validation:
            argv.append(f"--partition={partition}")
        if self.qos:
            argv.append(f"--qos={self.qos}")
        reservation = f"{VALIDATION_PREFIX}{job.node}" if job.validation else self.reservation
        if reservation:
            argv.append(f"--reservation={reservation}")
        if self.account:
            argv.append(f"--account={self.account}")
        return argv + self.extra_args

    async def submit(self, job: CheckJob) -> JobHandle:
        output = self.output_dir / f"{job.run_id}.out"
        argv = self._argv(job, output)
        nonce = secrets.token_hex(16)
        self.submissions.append(argv)
        _, out, _ = await self._run(*argv, input=script(job.check, job.run_id, nonce, job.argv), private=True)
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise RunnerError(f"sbatch answered {out.strip()[:200]!r}, not a job id")
        return JobHandle(
            job.run_id, job.node, job_id, str(output), time.time(), job.time_limit_s, nonce, job.peers
        )

    async def _collect(self, handle: JobHandle) -> tuple[str, str]:
        """The job's output and "", or "" and why it was not taken (:mod:`.check_output`); read on the
        threads for users' files, within ``read_timeout_s`` (a hung file system stalls only this run)."""
        read = functools.partial(
            read_output,
            handle.output,
            owner=self.owner,
            expected=header(handle.run_id, handle.job_id, handle.nonce),
            limit=self.max_output_bytes,
        )
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(FILE_IO, read), self.read_timeout_s)
        except TimeoutError:
            return (
                "",
                f"{UNREADABLE}: {handle.output}: no answer from the file system in {self.read_timeout_s:g}s",
            )

    async def wait(self, handle: JobHandle) -> RunOutput:
        deadline = handle.submitted_at + handle.time_limit_s + self.grace_s
        started: float | None = None
        peers_asked = time.monotonic()
        while True:
            rc, out, err = await self._run(
                self.slurm.scontrol, "show", "job", "-o", handle.job_id, check=False
            )
            info = parse_job(out.strip()) if rc == 0 else {}
            state = info.get("JobState", "")
            if rc != 0 and "Invalid job id" in (err + out):
                text, unread = await self._collect(handle)
                status: JobStatus = "completed" if text or unread.startswith(REFUSED) else "lost"
                gone = "the job left slurmctld's memory" + (f"; {unread}" if status == "lost" else "")
                return RunOutput(status, text, None, gone, None, handle.job_id, unread)
            if state in ("RUNNING", "COMPLETING") and started is None:
                started = time.time()
            if state == "PENDING" and handle.peers and time.monotonic() - peers_asked >= PEER_CHECK_S:
                peers_asked = time.monotonic()
                taken = await self._taken(handle)
                if taken:  # Slurm gave a peer to another job: waiting would hold the run for its time limit
                    await self.cancel(handle)
                    return RunOutput("not_started", "", None, f"did not start: {taken}", None, handle.job_id)
            if state == "PENDING" and info.get("Reason", "").startswith(_NODE_GONE_REASONS):
                gone = await self._out_of_service(handle.node)
                if gone:  # drained or down since the submission: it would wait for its whole time limit
                    await self.cancel(handle)
                    return RunOutput(
                        "not_started", "", None, f"did not start: {handle.node} {gone}", None, handle.job_id
                    )
            if state in _TERMINAL:
                code, _, signal = info.get("ExitCode", "0:0").partition(":")
                exit_code = int(code) if code.isdigit() else None
                if signal.isdigit() and int(signal) and exit_code == 0:
                    exit_code = 128 + int(signal)
                text, unread = await self._collect(handle)
                return RunOutput(
                    _TERMINAL[state],  # type: ignore[arg-type]
                    text,
                    exit_code,
                    f"{state} {info.get('Reason', '')}".strip(),
                    time.time() - (started or handle.submitted_at),
                    handle.job_id,
                    unread,
                )
            if time.time() > deadline:
                await self.cancel(handle)
                if started is None:
                    return RunOutput(
                        "not_started",
                        "",
                        None,
                        f"did not start: {state} {info.get('Reason', '')}",
                        None,
                        handle.job_id,
                    )
                return RunOutput(
                    "timeout",
                    "",  # not read: a time-out is judged on the time alone
                    None,
                    f"cancelled after its time limit ({handle.time_limit_s:g}s + {self.grace_s:g}s)",
                    time.time() - started,
                    handle.job_id,
                )
            await asyncio.sleep(self.poll_interval_s)

    async def _taken(self, handle: JobHandle) -> str:
        """Which peer of ``handle``'s pending job another job holds ("PEER taken by job N"), "" if none."""
        nodes = ",".join(handle.peers)
        rc, out, _ = await self._run(
            self.slurm.squeue, "-h", "-t", _HOLDING, "-w", nodes, "-o", "%i|%N", check=False
        )
        if rc != 0:
            return ""
        for line in out.splitlines():
            job_id, _, hosts = line.strip().partition("|")
            if not job_id or job_id == handle.job_id:
                continue
            for h in expand_hostlist(hosts) if hosts else []:
                if h in handle.peers:
                    return f"{h} taken by job {job_id}"
        return ""

    async def _out_of_service(self, node: str) -> str:
        """Why ``node`` is out of service (drained, down), "" when it is not or that is not known."""
        try:
            st = (await self.slurm.node_states([node])).get(node)
        except SchedulerError:
            return ""
        if st is None:
            return ""
        if st.drained:
            return f"drained ({st.reason or 'no reason'})"
        return f"is {st.state}" if st.state in ("down", "fail") else ""

    async def cancel(self, handle: JobHandle) -> None:
        await self._run(self.scancel, handle.job_id, check=False)

    async def begin_validation(self, node: str, time_limit_s: float) -> None:
        minutes = max(1, math.ceil((time_limit_s + 4 * self.grace_s) / 60))
        name = f"{VALIDATION_PREFIX}{node}"
        await self._run(self.slurm.scontrol, "delete", f"ReservationName={name}", check=False)
        await self._run(
            self.slurm.scontrol,
            "create",
            "reservation",
            f"ReservationName={name}",
            f"Nodes={node}",
            f"Users={self.user}",
            "StartTime=now",
            f"Duration={minutes}",
            "Flags=MAINT,IGNORE_JOBS",
        )
        try:  # the Slurm port's resume: only a drain watchd made is lifted
            lifted = await self.slurm.resume(node)
        except SchedulerError as exc:
            lifted = ResumeResult(node, "failed", str(exc))
        if lifted.outcome not in ("resumed", "not_drained"):
            await self._run(self.slurm.scontrol, "delete", f"ReservationName={name}", check=False)
            raise RunnerError(f"cannot lift the drain of {node}: {lifted.detail}")

    async def end_validation(self, node: str, passed: bool, reason: str) -> str:
        name = f"{VALIDATION_PREFIX}{node}"
        done = "resumed"
        if not passed:  # the Slurm port's drain, as planned: drained again with the new evidence
            try:
                again = (await self.slurm.apply_drain({drain_reason(reason): [node]}))[node]
            except SchedulerError as exc:
                raise RunnerError(str(exc)) from exc
            if again.outcome != "drained":
                raise RunnerError(f"cannot drain {node} again: {again.detail}")
            done = "drained"
        await self._run(self.slurm.scontrol, "delete", f"ReservationName={name}", check=False)
        return done

    async def abandon_validation(self, node: str) -> None:
        name = f"{VALIDATION_PREFIX}{node}"
        await self._run(self.slurm.scontrol, "delete", f"ReservationName={name}", check=False)

    async def lend(self, node: str, partners: Sequence[str]) -> None:
        name = f"{VALIDATION_PREFIX}{node}"
        nodes = ",".join((node, *partners))
        await self._run(self.slurm.scontrol, "update", f"ReservationName={name}", f"Nodes={nodes}")


def runner_from_config(config: Any) -> SlurmCheckRunner:
    checks: ChecksConfig = config.checks
    slurm = config.slurm
    env = {"SLURM_CONF": str(slurm.slurm_conf)} if slurm.slurm_conf else None
    scheduler = SlurmScheduler(
        scontrol=slurm.scontrol,
        squeue=slurm.squeue,
        sinfo=slurm.sinfo,
        timeout=slurm.timeout_s,
        env=env,
        persistent=False,
    )
    check_output_dir(checks.output_dir)  # ConfigError when others could write there; created when missing
    c = checks.slurm
    return SlurmCheckRunner(
        scheduler,
        output_dir=checks.output_dir,
        sbatch=c.sbatch,
        scancel=c.scancel,
        partition=c.partition,
        qos=c.qos,
        reservation=c.reservation,
        account=c.account,
        extra_args=c.extra_args,
        poll_interval_s=c.poll_interval_s,
        grace_s=c.grace,
        user=c.user,
        max_output_bytes=checks.max_output_bytes,
    )
