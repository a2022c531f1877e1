"""An in-memory scheduler with the semantics of :class:`~watchd.integrations.slurm.scheduler.SlurmScheduler`.

For unit tests and the demo: nodes, jobs with a requeue flag, admin drains, and a record of every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from watchd.integrations.base import SCHEDULER_VERBS, Privileges, RequeueResult, SchedulerError, job_selected
from watchd.integrations.fake.settings import FakeSchedulerConfig
from watchd.model.nodes import (
    REBOOT_FLAGS,
    WATCHD_REASON_PREFIX,
    DrainResult,
    NodeState,
    RebootResult,
    ResumeResult,
    drain_reason,
    plan_drain,
    refuse_reboot,
    refuse_resume,
)
from watchd.port import VerbTable


@dataclass(slots=True)
class FakeJob:
    job_id: str
    nodes: tuple[str, ...]
    requeue: bool = True
    state: str = "running"  # running | pending
    restarts: int = 0


@dataclass(slots=True)
class FakeScheduler:
    """``nodes`` and ``jobs`` are public: tests may read and set them directly.

    Failure injection: a node in ``fail_drain`` fails to drain, a job in ``fail_requeue`` fails to requeue,
    and ``error`` (if set) is raised by every call, like a missing ``scontrol``."""

    reason_prefix: str = WATCHD_REASON_PREFIX
    nodes: dict[str, NodeState] = field(default_factory=dict)
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    fail_drain: set[str] = field(default_factory=set)
    fail_requeue: set[str] = field(default_factory=set)
    error: SchedulerError | None = None
    verbs: ClassVar[VerbTable] = SCHEDULER_VERBS
    privileged: bool | None = True  # what privileges() answers
    partitions: dict[str, list[str]] = field(default_factory=dict)  # empty: one pool "all" of every node
    reboots: dict[str, str] = field(default_factory=dict)  # node -> its reason, while a reboot is pending
    name: str = "fake"

    # ------------------------------------------------------------- setup
    def add_node(
        self, name: str, state: str = "idle", flags: Iterable[str] = (), reason: str | None = None
    ) -> NodeState:
        st = NodeState(name=name, state=state, flags=frozenset(flags), reason=reason)
        self.nodes[name] = st
        return st

    def add_nodes(self, names: Iterable[str]) -> None:
        for n in names:
            self.add_node(n)

    def add_job(self, job_id: str, nodes: Sequence[str], requeue: bool = True) -> FakeJob:
        for n in nodes:
            if n not in self.nodes:
                self.add_node(n)
            st = self.nodes[n]
            if st.state == "idle":
                self.nodes[n] = replace(st, state="allocated")
        job = FakeJob(job_id=job_id, nodes=tuple(nodes), requeue=requeue)
        self.jobs[job_id] = job
        return job

    def set_admin_drain(self, node: str, reason: str) -> None:
        """Drain ``node`` as an administrator would (a reason without watchd's prefix)."""
        st = self.nodes.get(node) or self.add_node(node)
        self.nodes[node] = replace(st, flags=st.flags | {"DRAIN"}, reason=reason)

    def set_down(self, node: str, reason: str = "Not responding") -> None:
        st = self.nodes.get(node) or self.add_node(node)
        self.nodes[node] = replace(st, state="down", flags=st.flags | {"NOT_RESPONDING"}, reason=reason)

    def calls_of(self, method: str) -> list[Any]:
        return [args for name, args in self.calls if name == method]

    # ------------------------------------------------------------- protocol
    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    async def node_states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        self.calls.append(("node_states", tuple(nodes)))
        self._check()
        return {n: self.nodes[n] for n in dict.fromkeys(nodes) if n in self.nodes}

    async def pools(self) -> dict[str, list[str]]:
        self.calls.append(("pools", None))
        self._check()
        return {name: list(nodes) for name, nodes in self.partitions.items()} or {"all": list(self.nodes)}

    async def drain(
        self, reasons: Mapping[str, str], states: Mapping[str, NodeState] | None = None
    ) -> dict[str, DrainResult]:
        self.calls.append(("drain", dict(reasons)))
        self._check()
        results, groups = plan_drain(reasons, self.nodes if states is None else states, self.reason_prefix)
        results.update(self._drain_groups(groups))
        return {n: results[n] for n in reasons}

    async def apply_drain(self, groups: Mapping[str, Sequence[str]]) -> dict[str, DrainResult]:
        self.calls.append(("drain", {n: reason for reason, names in groups.items() for n in names}))
        self._check()
        return self._drain_groups(groups)

    def _drain_groups(self, groups: Mapping[str, Sequence[str]]) -> dict[str, DrainResult]:
        results: dict[str, DrainResult] = {}
        for reason, names in groups.items():
            # the real adapter issues one `scontrol update` per distinct reason: record the same grouping
            self.calls.append(("update_drain", (reason, tuple(names))))
            for n in names:
                if n in self.fail_drain:
                    results[n] = DrainResult(n, "failed", f"injected failure draining {n}")
                    continue
                st = self.nodes[n]
                self.nodes[n] = replace(st, flags=st.flags | {"DRAIN"}, reason=reason)
                results[n] = DrainResult(n, "drained", reason)
        return results

    async def requeue_jobs_on(self, node: str, job: str | None = None) -> RequeueResult:
        self.calls.append(("requeue_jobs_on", node if job is None else (node, job)))
        self._check()
        if node not in self.nodes:
            raise SchedulerError(f"squeue -w {node}: exit status 1: Invalid node name {node}")
        requeued: list[str] = []
        not_requeueable: list[str] = []
        failed: dict[str, str] = {}
        for each in list(self.jobs.values()):
            if each.state != "running" or node not in each.nodes:
                continue
            if not job_selected(job, each.job_id, f"slurm:{each.job_id}"):
                continue
            if not each.requeue:
                not_requeueable.append(each.job_id)
            elif each.job_id in self.fail_requeue:
                failed[each.job_id] = f"injected failure requeueing {each.job_id}"
            else:
                self._release(each)
                each.state, each.nodes, each.restarts = "pending", (), each.restarts + 1
                requeued.append(each.job_id)
        return RequeueResult(node, tuple(requeued), tuple(not_requeueable), failed)

    def _release(self, job: FakeJob) -> None:
        for n in job.nodes:
            busy = any(j is not job and j.state == "running" and n in j.nodes for j in self.jobs.values())
            st = self.nodes.get(n)
            if st is not None and not busy and st.state in ("allocated", "mixed"):
                self.nodes[n] = replace(st, state="idle")

    async def resume(self, node: str) -> ResumeResult:
        self.calls.append(("resume", node))
        self._check()
        st = self.nodes.get(node)
        refusal = refuse_resume(st, node, self.reason_prefix)
        if refusal is not None:
            return refusal
        assert st is not None
        self.nodes[node] = replace(st, flags=st.flags - {"DRAIN"}, reason=None)
        return ResumeResult(node, "resumed", st.reason or "")

    async def reboot(self, node: str, reason: str) -> RebootResult:
        """As Slurm's ``scontrol reboot ASAP nextstate=DOWN``: pending while a job runs on the node
        (REBOOT_REQUESTED), then issued (REBOOT_ISSUED); :meth:`complete_reboot` brings it back, down with
        ``reason``. Asked again while pending: nothing more."""
        self.calls.append(("reboot", node))
        self._check()
        st = self.nodes.get(node)
        refusal = refuse_reboot(st, node, self.reason_prefix)
        if refusal is not None:
            return refusal
        assert st is not None
        if st.reboot_pending:
            return RebootResult(node, "rebooting", "a reboot is pending already", st.boot_id)
        busy = any(node in j.nodes and j.state == "running" for j in self.jobs.values())
        flag = "REBOOT_REQUESTED" if busy else "REBOOT_ISSUED"
        self.nodes[node] = replace(
            st, flags=st.flags | {flag}, reason=drain_reason(reason, self.reason_prefix)
        )
        self.reboots[node] = drain_reason(reason, self.reason_prefix)
        return RebootResult(node, "rebooting", flag.lower(), st.boot_id)

    def complete_reboot(self, node: str, boot_id: str) -> None:
        """The node came back from its reboot (its new ``boot_id``) as Slurm 22.05 brings it back: DOWN, no
        longer DRAIN, the reason with `` : reboot issued : reboot complete`` appended."""
        st = self.nodes[node]
        reason = f"{self.reboots.pop(node, st.reason)} : reboot issued : reboot complete"
        flags = st.flags - REBOOT_FLAGS - {"DRAIN"}
        self.nodes[node] = replace(st, state="down", flags=flags, reason=reason, boot_id=boot_id)

    async def privileges(self) -> Privileges:
        self.calls.append(("privileges", None))
        what = {True: "may act", False: "refused", None: "unknown"}[self.privileged]
        return Privileges(self.privileged, f"the fake scheduler: {what}")


def scheduler_from_settings(cfg: FakeSchedulerConfig) -> FakeScheduler:
    scheduler = FakeScheduler(partitions={name: list(nodes) for name, nodes in cfg.partitions.items()})
    scheduler.add_nodes(dict.fromkeys([*cfg.nodes, *(n for nodes in cfg.partitions.values() for n in nodes)]))
    return scheduler
