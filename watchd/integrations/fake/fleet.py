"""The fleet of a :class:`~watchd.integrations.fake.scheduler.FakeScheduler`, with Slurm's
semantics: a spare is a node in watchd's reservation, a node with a running job cannot become one (the
call fails, as ``scontrol create reservation`` does with "Requested nodes are busy"), and a requeued job
starts on a node only when it is idle and not a spare (:meth:`FakeFleet.schedule`, what slurmctld does on
its next pass)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from watchd.integrations.base import SchedulerError
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.fleet import FleetNode

_FLEETS: dict[int, FakeFleet] = {}


class FakeFleet:
    name = "fake"

    def __init__(self, scheduler: FakeScheduler) -> None:
        self.scheduler = scheduler
        self.reserved: dict[str, list[str]] = {}
        self.since: dict[str, float] = {}  # node -> when its reason was set (tests set it)
        self.users: dict[str, str] = {}
        self.calls: list[tuple[str, object]] = []
        self.job_sizes: dict[str, int] = {}  # job -> nodes it needs when it starts again (default 1)

    def _partitions(self) -> dict[str, list[str]]:
        s = self.scheduler
        return {p: list(n) for p, n in s.partitions.items()} or {"all": list(s.nodes)}

    async def fleet_nodes(self) -> list[FleetNode]:
        self.calls.append(("fleet_nodes", None))
        s = self.scheduler
        if s.error is not None:
            raise s.error
        member: dict[str, list[str]] = {}
        for p, names in self._partitions().items():
            for n in names:
                member.setdefault(n, []).append(p)
        spare = {n for nodes in self.reserved.values() for n in nodes}
        out = []
        now = time.time()
        for name, st in s.nodes.items():
            if st.reason:  # Slurm stamps a reason when it is set: so does the fake, when it first sees it
                self.since.setdefault(name, now)
            else:
                self.since.pop(name, None)
            out.append(
                FleetNode(
                    name=name,
                    scheduler="fake",
                    partitions=tuple(member.get(name, ())),
                    state=st.state,
                    flags=st.flags | ({"RESERVED"} if name in spare else frozenset()),
                    reason=st.reason,
                    user=self.users.get(name),
                    since=self.since.get(name),
                    spare=name in spare,
                )
            )
        return out

    async def spares(self) -> dict[str, list[str]]:
        return {p: list(n) for p, n in self.reserved.items() if n}

    async def set_spares(self, partition: str, nodes: Sequence[str]) -> None:
        self.calls.append(("set_spares", (partition, tuple(nodes))))
        s = self.scheduler
        if s.error is not None:
            raise s.error
        current = set(self.reserved.get(partition, ()))
        for n in nodes:
            st = s.nodes.get(n)
            if st is None:
                raise SchedulerError(f"scontrol update reservation: Invalid node name {n}")
            busy = any(j.state == "running" and n in j.nodes for j in s.jobs.values())
            if n not in current and (busy or st.state != "idle"):
                raise SchedulerError("Error updating the reservation: Requested nodes are busy")
        if nodes:
            self.reserved[partition] = list(nodes)
        else:
            self.reserved.pop(partition, None)

    async def pending(self, jobs: Sequence[str]) -> set[str]:
        self.calls.append(("pending", tuple(jobs)))
        s = self.scheduler
        if s.error is not None:
            raise s.error
        return {j for j in jobs if j in s.jobs and s.jobs[j].state == "pending"}

    def schedule(self) -> list[str]:
        """Start each pending job on idle nodes that are in service and not spares (slurmctld's pass);
        returns the jobs started."""
        s = self.scheduler
        spare = {n for nodes in self.reserved.values() for n in nodes}
        started = []
        for job in s.jobs.values():
            if job.state != "pending":
                continue
            free = [
                n
                for n, st in s.nodes.items()
                if st.state == "idle"
                and not st.flags
                and n not in spare
                and not any(j.state == "running" and n in j.nodes for j in s.jobs.values())
            ]
            want = self.job_sizes.get(job.job_id, 1)
            if len(free) < want:
                continue
            job.nodes, job.state = tuple(free[:want]), "running"
            for n in job.nodes:
                s.nodes[n] = replace(s.nodes[n], state="allocated")
            started.append(job.job_id)
        return started


def fleet_of(scheduler: FakeScheduler) -> FakeFleet:
    """One fleet per fake scheduler (its reservations live as long as the scheduler)."""
    fleet = _FLEETS.get(id(scheduler))
    if fleet is None or fleet.scheduler is not scheduler:
        fleet = _FLEETS[id(scheduler)] = FakeFleet(scheduler)
    return fleet
