"""Slurm scheduler adapter: ``scontrol`` / ``squeue`` through asyncio subprocesses (never a shell).

Behaviour of Slurm 22.05 this relies on (checked against a real cluster, see tests/test_slurm_adapter.py):

- ``scontrol show node -o <hostlist>`` accepts a hostlist expression (``gpu-[1-2],sim-5``) and prints one line
  per node. Unknown names print ``Node X not found`` on stderr and make the exit status 1, the known nodes are
  still printed on stdout.
- ``State=`` is ``BASE[+FLAG...]``: ``IDLE+DRAIN``, ``MIXED+DRAIN``, ``DOWN+DRAIN+NOT_RESPONDING``; some tools
  and versions print a trailing ``*`` for not responding (``IDLE*``), which is mapped to ``NOT_RESPONDING``.
- ``Reason=`` is free text (spaces, ``=``, brackets) followed by `` [user@YYYY-MM-DDTHH:MM:SS]``.
- ``scontrol update NodeName=a,b,nope State=DRAIN`` exits 1 ("Invalid node name specified") but *has already
  updated* the nodes before the bad one: unknown nodes are therefore filtered out before the update, and a
  failed group is re-read to find which of its nodes did get drained.
- ``squeue --json`` ignores ``-w`` and ``-t`` in 22.05 (it returns every job, every field), so watchd reads no
  JSON: jobs on a node are listed with ``squeue -h -w NODE -t ... -O JobID,State,Requeue`` (the ``Requeue``
  field is 0/1), the running jobs with ``squeue -h --states=RUNNING -o`` (:func:`parse_running_jobs`; the
  same output on 22.05 and 24.11, both tested live).
- ``scontrol requeue 1,2,3`` requeues what it can and prints one ``<error> for job <id>`` line per failure
  (non-requeueable: "Requested operation is presently disabled").
- ``Reason=`` values lose one leading and one trailing ``"`` in scontrol: the value is always sent quoted
  (``Reason="..."``) so that it arrives exactly, quotes included.

``show node`` and ``update`` (drain, resume) go through a long-lived interactive ``scontrol``
(:mod:`watchd.integrations.slurm.scontrol_session`, ~1 ms and ~0.5 ms instead of ~3.5 ms per spawned
process) unless
``persistent=False``. Interactive commands have no exit status: one counts as failed when it printed on
stderr. When the session fails (died, framing surprise, could not start) the call is retried once as a
one-shot process; a timeout is not retried (the controller is slow, a second process would wait as long).
Lines that interactive scontrol cannot carry exactly (non-ASCII, some quote patterns) go one-shot directly.
Call :meth:`SlurmScheduler.aclose` (or use it as an async context manager) to stop the child.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType

from watchd.integrations.base import (
    SCHEDULER_VERBS,
    PlannedDrain,
    Privileges,
    RequeueResult,
    SchedulerError,
    job_selected,
)
from watchd.integrations.slurm.calls import count_call
from watchd.integrations.slurm.privileges import probe
from watchd.integrations.slurm.scontrol_session import (
    ScontrolSession,
    SessionError,
    SessionStartError,
    SessionTimeout,
    interactive_line,
)
from watchd.integrations.slurm.settings import SlurmConfig
from watchd.jobs.model import JobInfo, JobProviderError
from watchd.model.hostlist import expand_hostlist
from watchd.model.nodes import (
    WATCHD_REASON_PREFIX,
    DrainResult,
    NodeState,
    RebootResult,
    ResumeResult,
    describe,
    drain_reason,
    refuse_reboot,
    refuse_resume,
)

#: ReturnToService=2 puts a node back in service when its slurmd registers, whatever its reason: a node
#: rebooted with nextstate=DOWN would serve again before it was validated
_RTS_REFUSAL = (
    "not rebooted: slurm.conf has ReturnToService=2, which returns a rebooted node to service before watchd"
    " validates it (set ReturnToService=0 or 1)"
)
# Job states in which a job holds a node and can be requeued.
_ACTIVE_JOB_STATES = ("RUNNING", "CONFIGURING", "SUSPENDED")
# One argv entry must stay under MAX_ARG_STRLEN (128 KiB); keep node lists well below it.
_MAX_NODELIST_CHARS = 32_000
_REASON_ANNOTATION = re.compile(r" \[[^\[\]\s]*@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\]")
_AFTER_REASON_KEYS = re.compile(r" (?:Comment|Extra|ResumeAfterTime|InstanceId|InstanceType)=")
_JOB_ERROR = re.compile(r"^(?P<msg>.*?) for job (?P<job>\S+)\s*$")
# After the interactive scontrol could not be started, go one-shot for this long before trying again.
_SESSION_RETRY_S = 30.0


# --------------------------------------------------------------------------- hostlists
def compress_hostlist(names: Iterable[str]) -> str:
    """``["gpu-1", "gpu-2", "gpu-3", "cpu-7"]`` -> ``"cpu-7,gpu-[1-3]"`` (a Slurm hostlist expression).

    Zero-padded numbers keep their width (``n[01-03]``); names without a trailing number pass unchanged."""
    groups: dict[tuple[str, int], set[int]] = defaultdict(set)
    plain: set[str] = set()
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m is None or "[" in name or "," in name:
            plain.add(name)
            continue
        digits = m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups[(m.group(1), width)].add(int(digits))
    parts = sorted(plain)
    for (prefix, width), nums in sorted(groups.items()):
        ranges: list[str] = []
        ordered = sorted(nums)
        start = prev = ordered[0]
        for n in [*ordered[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            a, b = f"{start:0{width}d}", f"{prev:0{width}d}"
            ranges.append(a if start == prev else f"{a}-{b}")
            if n is not None:
                start = prev = n
        if len(ranges) == 1 and "-" not in ranges[0]:
            parts.append(f"{prefix}{ranges[0]}")
        else:
            parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)


def _chunks(names: Sequence[str]) -> list[list[str]]:
    """Split a node list so that each compressed hostlist fits comfortably in one argv entry."""
    if len(compress_hostlist(names)) <= _MAX_NODELIST_CHARS:
        return [list(names)]
    mid = len(names) // 2
    return _chunks(names[:mid]) + _chunks(names[mid:])


# --------------------------------------------------------------------------- parsing
#: the running jobs' listing: ``squeue -h --states=RUNNING -o`` with these fields, the name last (it may hold
#: ``|``); ``SLURM_TIME_FORMAT=%s`` prints the start time as epoch seconds
RUNNING_FORMAT = "%i|%N|%P|%u|%S|%j"


def parse_running_jobs(text: str) -> list[JobInfo]:
    """``squeue -h --states=RUNNING -o '%i|%N|%P|%u|%S|%j'`` (:data:`RUNNING_FORMAT`, epoch start times) ->
    the running jobs with their nodes. The same on every Slurm since 22.05 (checked live on 22.05 and
    24.11); a line that is not a job is skipped."""
    out: list[JobInfo] = []
    for line in text.splitlines():
        fields = line.split("|", 5)
        if len(fields) < 6:
            continue
        job_id, nodes, partition, user, start, name = (f.strip() for f in fields)
        if not job_id or not nodes or nodes in ("(null)", "None assigned"):
            continue
        try:
            started: float | None = float(start)
        except ValueError:  # N/A, Unknown
            started = None
        out.append(
            JobInfo(
                id=f"slurm:{job_id}",
                nodes=tuple(expand_hostlist(nodes)),
                source="slurm",
                partition=partition or None,
                name=name or None,
                user=user or None,
                start_time=started or None,
            )
        )
    return out


def parse_state(raw: str) -> tuple[str, frozenset[str]]:
    """``"MIXED+DRAIN"`` -> ``("mixed", {"DRAIN"})``; ``"IDLE*"`` -> ``("idle", {"NOT_RESPONDING"})``."""
    base, *flags = raw.split("+")
    flagset = {f.upper() for f in flags if f}
    stripped = base.rstrip("*~#%!@^$-")
    if "*" in base[len(stripped) :]:
        flagset.add("NOT_RESPONDING")
    base = stripped.lower()
    # older spellings: DRAINED/DRAINING as a base state
    if base in ("drained", "draining", "drain"):
        flagset.add("DRAIN")
        base = "idle" if base == "drained" else "allocated" if base == "draining" else "idle"
    return base or "unknown", frozenset(flagset)


def parse_reason(line: str) -> str | None:
    idx = line.find(" Reason=")
    if idx < 0:
        return None
    rest = line[idx + len(" Reason=") :]
    m = _REASON_ANNOTATION.search(rest)
    if m is not None:
        reason = rest[: m.start()]
    else:
        m2 = _AFTER_REASON_KEYS.search(rest)
        reason = rest[: m2.start()] if m2 else rest
    reason = reason.strip()
    return None if reason in ("", "(null)", "None") else reason


def parse_node_line(line: str) -> NodeState | None:
    m = re.match(r"NodeName=(\S+)", line)
    if m is None:
        return None
    s = re.search(r" State=(\S+)", line)
    state, flags = parse_state(s.group(1)) if s else ("unknown", frozenset[str]())
    boot = re.search(r" BootTime=(\S+)", line)
    return NodeState(
        name=m.group(1),
        state=state,
        flags=flags,
        reason=parse_reason(line),
        boot_id=boot.group(1) if boot and boot.group(1) not in ("None", "Unknown") else None,
    )


# --------------------------------------------------------------------------- adapter
class SlurmScheduler(PlannedDrain):
    """The real :class:`~watchd.integrations.base.Scheduler` for Slurm (22.05+)."""

    name = "slurm"
    verbs = SCHEDULER_VERBS

    def __init__(
        self,
        *,
        scontrol: str = "scontrol",
        squeue: str = "squeue",
        sinfo: str = "sinfo",
        timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
        reason_prefix: str = WATCHD_REASON_PREFIX,
        max_concurrency: int = 8,
        persistent: bool = True,
    ) -> None:
        self.scontrol = scontrol
        self.squeue = squeue
        self.sinfo = sinfo
        self.timeout = timeout
        self.env_extra = dict(env or {})
        self.reason_prefix = reason_prefix
        self.max_concurrency = max_concurrency
        self.persistent = persistent
        self.session: ScontrolSession | None = (
            ScontrolSession(scontrol, env=self.env_extra) if persistent else None
        )
        self._session_retry_at = 0.0
        self.session_fallbacks = 0  # calls retried one-shot after a session failure
        self._rts: str | None = None

    async def aclose(self) -> None:
        """Stop the interactive scontrol (if one is running). The scheduler stays usable: a later call starts
        a new one."""
        if self.session is not None:
            await self.session.aclose()

    async def __aenter__(self) -> SlurmScheduler:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # ------------------------------------------------------------- subprocess
    async def command(
        self, *argv: str, check: bool = True, env: Mapping[str, str] | None = None
    ) -> tuple[int, str, str]:
        """Run ``argv`` with a timeout; return (rc, stdout, stderr). ``check`` raises on rc != 0. ``env``:
        more variables for this command. Every Slurm command of this integration goes through here (the
        fleet's too; the checks runner and the report count theirs too):
        :func:`~watchd.integrations.slurm.calls.count_call`."""
        env = {**os.environ, **self.env_extra, **(env or {})}
        cmd = " ".join(argv)
        count_call(argv[0])
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except OSError as exc:  # FileNotFoundError, PermissionError
            raise SchedulerError(f"{cmd}: cannot run {argv[0]!r}: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise SchedulerError(f"{cmd}: timed out after {self.timeout:g}s (killed)") from None
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        rc = proc.returncode if proc.returncode is not None else -1
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        if check and rc != 0:
            raise SchedulerError(f"{cmd}: exit status {rc}: {stderr.strip() or stdout.strip()}")
        return rc, stdout, stderr

    async def _scontrol(self, *args: str, check: bool = True) -> tuple[int, str, str]:
        """``scontrol <args>`` through the interactive session when possible, else as a one-shot process.

        In the session there is no exit status: rc is 1 when the command printed on stderr, else 0."""
        session = self.session
        line = interactive_line(args) if session is not None else None
        if session is not None and line is not None and time.monotonic() >= self._session_retry_at:
            try:
                count_call(self.scontrol)  # one request to slurmctld, like a process
                out, err = await session.run(line, self.timeout)
            except SessionTimeout:
                raise
            except SessionError as exc:
                self.session_fallbacks += 1
                if isinstance(exc, SessionStartError):
                    self._session_retry_at = time.monotonic() + _SESSION_RETRY_S
            else:
                rc = 1 if err.strip() else 0
                if check and rc != 0:
                    raise SchedulerError(f"{self.scontrol} {line}: {err.strip()}")
                return rc, out, err
        return await self.command(self.scontrol, *_one_shot_args(args), check=check)

    # ------------------------------------------------------------- protocol
    async def node_states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        wanted = list(dict.fromkeys(nodes))
        if not wanted:
            return {}
        results = await asyncio.gather(*(self._show_nodes(chunk) for chunk in _chunks(wanted)))
        merged: dict[str, NodeState] = {}
        for r in results:
            merged.update(r)
        return {n: merged[n] for n in wanted if n in merged}

    async def _show_nodes(self, names: Sequence[str]) -> dict[str, NodeState]:
        argv = (self.scontrol, "show", "node", "-o", compress_hostlist(names))
        rc, out, err = await self._scontrol("show", "node", argv[-1], check=False)
        if rc != 0:
            # unknown names: "Node X not found" (22.05 prints it on stdout), exit status 1; not an error here
            not_found = re.compile(r"^Node \S+ not found$")
            other = [ln for ln in err.splitlines() if ln.strip() and not not_found.match(ln.strip())]
            explained = any(not_found.match(ln.strip()) for ln in (out + "\n" + err).splitlines())
            if other or not explained:
                raise SchedulerError(f"{' '.join(argv)}: exit status {rc}: {err.strip() or out.strip()}")
        states: dict[str, NodeState] = {}
        for line in out.splitlines():
            st = parse_node_line(line.strip())
            if st is not None:
                states[st.name] = st
        return states

    async def pools(self) -> dict[str, list[str]]:
        _, out, _ = await self.command(self.sinfo, "-h", "-o", "%R|%N")
        members: dict[str, list[str]] = {}
        for line in out.splitlines():
            partition, _, nodes = line.strip().partition("|")
            if partition and nodes:
                members.setdefault(partition, []).extend(expand_hostlist(nodes))
        return members

    async def apply_drain(self, groups: Mapping[str, Sequence[str]]) -> dict[str, DrainResult]:
        results: dict[str, DrainResult] = {}
        sem = asyncio.Semaphore(self.max_concurrency)

        async def drain_group(reason: str, names: list[str]) -> None:
            async with sem:
                try:
                    await self._scontrol(
                        "update", f"NodeName={compress_hostlist(names)}", "State=DRAIN", f"Reason={reason}"
                    )
                except SchedulerError as exc:
                    await self._settle_failed_group(reason, names, str(exc), results)
                    return
            for n in names:
                results[n] = DrainResult(n, "drained", reason)

        await asyncio.gather(
            *(drain_group(r, chunk) for r, names in groups.items() for chunk in _chunks(list(names)))
        )
        return results

    async def _settle_failed_group(
        self, reason: str, names: list[str], error: str, results: dict[str, DrainResult]
    ) -> None:
        """scontrol may have drained part of a group before failing: re-read the group to tell which."""
        try:
            after = await self.node_states(names)
        except SchedulerError:
            after = {}
        for n in names:
            st = after.get(n)
            if st is not None and st.drained and st.reason == reason:
                results[n] = DrainResult(n, "drained", reason)
            else:
                results[n] = DrainResult(n, "failed", error)

    async def running_jobs(self) -> list[JobInfo]:
        """As a :class:`~watchd.jobs.model.JobProvider`: running jobs and their nodes. Only the running jobs,
        six short fields each (``squeue --states=RUNNING -o``): ``squeue --json`` would print every job of
        the queue with every field, and 22.05 ignores ``--states`` with ``--json``."""
        try:
            _, out, _ = await self.command(
                self.squeue,
                "-h",
                "--all",  # the jobs of every partition, hidden ones too (as --json lists them)
                "--states=RUNNING",
                "-o",
                RUNNING_FORMAT,
                env={"SLURM_TIME_FORMAT": "%s"},
            )
        except SchedulerError as exc:
            raise JobProviderError(str(exc)) from exc
        return parse_running_jobs(out)

    async def requeue_jobs_on(self, node: str, job: str | None = None) -> RequeueResult:
        _, out, _ = await self.command(
            self.squeue,
            "-h",
            "-w",
            node,
            "-t",
            ",".join(_ACTIVE_JOB_STATES),
            "-O",
            "JobID:|,State:|,Requeue:|",
        )
        requeueable: list[str] = []
        not_requeueable: list[str] = []
        for line in out.splitlines():
            fields = [f.strip() for f in line.split("|")]
            if len(fields) < 3 or not fields[0]:
                continue
            job_id, _state, requeue = fields[:3]
            if job_selected(job, job_id, f"slurm:{job_id}"):
                (requeueable if requeue == "1" else not_requeueable).append(job_id)
        if not requeueable:
            return RequeueResult(node, (), tuple(not_requeueable), {})

        rc, _, err = await self.command(self.scontrol, "requeue", ",".join(requeueable), check=False)
        failed: dict[str, str] = {}
        if rc != 0:
            attributed = {}
            for line in err.splitlines():
                m = _JOB_ERROR.match(line.strip())
                if m:
                    attributed[m.group("job")] = m.group("msg")
            if attributed:
                failed = {j: msg for j, msg in attributed.items() if j in requeueable}
            else:  # no per-job detail: ask job by job
                for job_id in requeueable:
                    failed.update(await self._requeue_one(job_id))
        done = tuple(j for j in requeueable if j not in failed)
        return RequeueResult(node, done, tuple(not_requeueable), failed)

    async def _requeue_one(self, job_id: str) -> dict[str, str]:
        rc, out, err = await self.command(self.scontrol, "requeue", job_id, check=False)
        text = err.strip() or out.strip()
        # "Job is pending execution": it was running when listed, so it has been requeued already
        if rc == 0 or "pending execution" in text:
            return {}
        return {job_id: f"scontrol requeue {job_id}: exit status {rc}: {text}"}

    async def resume(self, node: str) -> ResumeResult:
        st = (await self.node_states([node])).get(node)
        refusal = refuse_resume(st, node, self.reason_prefix)
        if refusal is not None:
            return refusal
        assert st is not None
        try:
            await self._scontrol("update", f"NodeName={node}", "State=RESUME")
        except SchedulerError as exc:
            # a node in state UNKNOWN (slurmd never registered) has its DRAIN cleared yet scontrol exits 1
            after = (await self.node_states([node])).get(node)
            if after is not None and not after.drained:
                return ResumeResult(node, "resumed", f"{st.reason or ''} (scontrol: {exc})")
            return ResumeResult(node, "failed", str(exc))
        return ResumeResult(node, "resumed", st.reason or "")

    async def reboot(self, node: str, reason: str) -> RebootResult:
        st = (await self.node_states([node])).get(node)
        refusal = refuse_reboot(st, node, self.reason_prefix)
        if refusal is not None:
            return refusal
        assert st is not None
        if st.reboot_pending:
            pending = f"a reboot is pending already ({describe(st)})"
            return RebootResult(node, "rebooting", pending, st.boot_id)
        if await self._return_to_service() == "2":
            return RebootResult(node, "refused", _RTS_REFUSAL)
        # ASAP: no new job starts there, a running one ends first; DOWN: back from the reboot out of service.
        # No reason=: the node keeps the reason it was drained for (the evidence, or a lemon's), and Slurm
        # appends " : reboot issued : reboot complete" to it
        await self.command(self.scontrol, "reboot", "ASAP", "nextstate=DOWN", node)
        shown = f"{drain_reason(reason, self.reason_prefix)} ({st.reason})"
        return RebootResult(node, "rebooting", shown, st.boot_id)

    async def _return_to_service(self) -> str | None:
        """slurm.conf's ReturnToService (read once; None when scontrol does not say)."""
        if self._rts is None:
            _, out, _ = await self.command(self.scontrol, "show", "config")
            m = re.search(r"^ReturnToService\s*=\s*(\S+)", out, re.MULTILINE)
            self._rts = m.group(1) if m else ""
        return self._rts or None

    async def privileges(self) -> Privileges:
        return await probe(self.scontrol, self.command)


def _one_shot_args(args: Sequence[str]) -> list[str]:
    """argv for a one-shot scontrol: ``Reason=`` values quoted (scontrol strips one ``"`` from each end), and
    ``show node`` in one-line mode (the session has ``oneliner`` on)."""
    out = [f'Reason="{a[len("Reason=") :]}"' if a.startswith("Reason=") else a for a in args]
    if out[:2] == ["show", "node"] and "-o" not in out:
        out.insert(2, "-o")
    return out


def scheduler_from_settings(cfg: SlurmConfig) -> SlurmScheduler:
    env = {"SLURM_CONF": str(cfg.slurm_conf)} if cfg.slurm_conf else None
    return SlurmScheduler(
        scontrol=cfg.scontrol, squeue=cfg.squeue, sinfo=cfg.sinfo, timeout=cfg.timeout_s, env=env
    )
