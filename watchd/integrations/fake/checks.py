"""The in-memory check runner: nodes with Slurm's states, jobs that finish with scripted outputs. Faithful
where the engine relies on it: the same availability rules as Slurm (idle, no flag, not reserved, no job),
a node that runs a job is busy until it ends, a job past its time limit is cancelled and reported ``timeout``,
validation lifts and restores the drain. Used by unit tests, the benchmark and demos."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from watchd.checks.runner import Availability, CheckJob, JobHandle, RunnerError, RunOutput

__all__ = ["FakeCheckRunner", "FakeNode", "runner_from_config"]

Script = Callable[[CheckJob], RunOutput]


@dataclass
class FakeNode:
    name: str
    partitions: tuple[str, ...] = ("gpu",)
    state: str = "idle"  # idle | allocated | mixed | down
    flags: set[str] = field(default_factory=set)  # DRAIN, RESERVED, ...
    reason: str | None = None
    reserved: bool = False


class FakeCheckRunner:
    name = "fake"

    def __init__(
        self, nodes: Sequence[FakeNode] = (), script: Script | None = None, delay_s: float = 0.0
    ) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.script: Script = script or (lambda job: RunOutput("completed", "", 0))
        self.delay_s = delay_s
        self.submitted: list[CheckJob] = []
        self.concurrent: dict[str, int] = {}  # partition -> jobs at once
        self.max_concurrent: dict[str, int] = {}
        self.refuse: set[str] = set()  # nodes whose submission fails
        self._jobs: dict[str, CheckJob] = {}
        self._ids = itertools.count(1)
        self.availability_calls = 0
        self.lent: dict[str, tuple[str, ...]] = {}  # node in validation -> the partners lent to it

    async def members(self, partitions: Sequence[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in self.nodes.values():
            for p in n.partitions:
                if not partitions or p in partitions:
                    out.setdefault(p, []).append(n.name)
        return out

    async def availability(self, nodes: Sequence[str], within_s: float) -> dict[str, Availability]:
        self.availability_calls += 1
        out: dict[str, Availability] = {}
        for name in nodes:
            n = self.nodes.get(name)
            if n is None:
                continue
            why = ""
            if n.state != "idle":
                why = f"node is {n.state}"
            elif "DRAIN" in n.flags:
                why = f"drained: {n.reason}"
            elif n.reserved or "RESERVED" in n.flags:
                why = "reserved"
            elif n.flags:
                why = f"flags {'+'.join(sorted(n.flags))}"
            out[name] = Availability(
                not why, why, n.partitions, bool(n.reason and n.reason.startswith("watchd:"))
            )
        return out

    async def submit(self, job: CheckJob) -> JobHandle:
        nodes = []
        for name in job.nodes:
            n = self.nodes.get(name)
            if n is None or name in self.refuse:
                raise RunnerError(f"sbatch: error: invalid node name {name}")
            if not job.validation and (n.state != "idle" or n.flags):
                raise RunnerError(f"{name} is not idle")
            nodes.append(n)
        self.submitted.append(job)
        for n in nodes:
            n.state = "allocated"
            for p in n.partitions:
                self.concurrent[p] = self.concurrent.get(p, 0) + 1
                self.max_concurrent[p] = max(self.max_concurrent.get(p, 0), self.concurrent[p])
        job_id = str(next(self._ids))
        self._jobs[job_id] = job
        return JobHandle(job.run_id, job.node, job_id, f"fake:{job_id}", time.time(), job.time_limit_s)

    async def wait(self, handle: JobHandle) -> RunOutput:
        job = self._jobs.get(handle.job_id)
        if job is None:
            return RunOutput("lost", detail=f"job {handle.job_id} unknown")
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            else:
                await asyncio.sleep(0)
            out = self.script(job)
            if out.status == "timeout":
                return RunOutput(
                    "timeout",
                    out.output,
                    None,
                    "cancelled at the time limit",
                    job.time_limit_s,
                    handle.job_id,
                )
            return RunOutput(out.status, out.output, out.exit_code, out.detail, out.duration_s, handle.job_id)
        finally:
            for name in job.nodes:
                n = self.nodes[name]
                if n.state == "allocated":
                    n.state = "idle"
                for p in n.partitions:
                    self.concurrent[p] -= 1

    async def cancel(self, handle: JobHandle) -> None:
        return None

    async def begin_validation(self, node: str, time_limit_s: float) -> None:
        n = self.nodes[node]
        n.reserved = True
        n.flags.discard("DRAIN")

    async def abandon_validation(self, node: str) -> None:
        self.nodes[node].reserved = False
        for partner in self.lent.pop(node, ()):
            self.nodes[partner].reserved = False

    async def lend(self, node: str, partners: Sequence[str]) -> None:
        for partner in self.lent.pop(node, ()):
            self.nodes[partner].reserved = False
        for partner in partners:
            if partner not in self.nodes:
                raise RunnerError(f"scontrol: error: invalid node name {partner}")
            self.nodes[partner].reserved = True
        self.lent[node] = tuple(partners)

    async def end_validation(self, node: str, passed: bool, reason: str) -> str:
        n = self.nodes[node]
        n.reserved = False
        for partner in self.lent.pop(node, ()):
            self.nodes[partner].reserved = False
        if passed:
            n.reason = None
            return "resumed"
        n.flags.add("DRAIN")
        n.reason = f"watchd: {reason}"
        return "drained"


def runner_from_config(config: Any) -> FakeCheckRunner:
    fake: Any = getattr(config, "fake", None)
    nodes: list[FakeNode] = []
    partitions: Mapping[str, list[str]] = getattr(fake, "partitions", {}) or {}
    names: list[str] = list(getattr(fake, "nodes", []) or [])
    if partitions:
        by_node: dict[str, list[str]] = {}
        for p, members in partitions.items():
            for m in members:
                by_node.setdefault(m, []).append(p)
        nodes = [FakeNode(n, tuple(ps)) for n, ps in by_node.items()]
    else:
        nodes = [FakeNode(n, ("all",)) for n in names]
    return FakeCheckRunner(nodes)
