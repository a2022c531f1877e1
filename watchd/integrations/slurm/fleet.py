"""The fleet as Slurm sees it: every node with its partitions, state, reason, who set it and when
(``sinfo -N -h -o '%N|%R|%T|%u|%H|%E'``, the fields of ``sinfo -R``), and the hot spares as one
reservation per partition that watchd owns (``watchd_spares_<partition>``).

Behaviour of Slurm 22.05 this relies on (checked on the test cluster, tests/drains/):

- ``%N`` is the node name (``%n`` in ``sinfo -R``'s own format is the *hostname*, which may be shared);
  ``%E`` is the reason, free text that may hold ``|``: it is the last field; ``%u`` and ``%H`` read
  ``Unknown`` for a node without a reason; ``%H`` is local time (``2026-12-04T18:50:15``).
- ``%T``: ``drained``, ``draining``, ``down*``, ``idle``, ``mixed``, ``allocated``, ``reserved`` (an idle
  node in an active reservation), ``fail``, ``maint`` ...: read with the adapter's :func:`parse_state`.
- ``scontrol create reservation ... Nodes=<busy node>`` fails with "Requested nodes are busy" (and so does
  an ``update`` adding one): Slurm itself refuses to make a spare of a node running a job.
- Jobs that do not name a reservation never start on its nodes; a node removed from it (``update
  ReservationName=.. Nodes=..``, or ``delete`` for the last one) is schedulable at once.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import replace

from watchd.integrations.base import SchedulerError
from watchd.integrations.slurm.scheduler import (
    SlurmScheduler,
    compress_hostlist,
    parse_state,
)
from watchd.model.fleet import FleetNode
from watchd.model.hostlist import expand_hostlist

RESERVATION_PREFIX = "watchd_spares_"
SINFO_FORMAT = "%N|%R|%T|%u|%H|%E"


def parse_slurm_time(text: str) -> float | None:
    """``2026-12-04T18:50:15`` (local time, as Slurm prints it) -> epoch seconds; None for ``Unknown``."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse_sinfo_nodes(text: str, spares: dict[str, list[str]] | None = None) -> list[FleetNode]:
    """``sinfo -N -h -o '%N|%R|%T|%u|%H|%E'`` -> one FleetNode per node (its partitions merged)."""
    spare_nodes = {n for nodes in (spares or {}).values() for n in nodes}
    by_name: dict[str, FleetNode] = {}
    for line in text.splitlines():
        fields = line.split("|", 5)
        if len(fields) < 6 or not fields[0].strip():
            continue
        name, partition, raw_state, user, when, reason = (f.strip() for f in fields)
        partition = partition.rstrip("*")  # the default partition is starred by some formats
        base, flags = parse_state(raw_state)
        if base == "reserved":
            base, flags = "idle", flags | {"RESERVED"}
        elif base in ("maint", "planned"):
            base, flags = "idle", flags | {base.upper()}
        known = by_name.get(name)
        if known is not None:
            if partition and partition not in known.partitions:
                by_name[name] = replace(known, partitions=(*known.partitions, partition))
            continue
        by_name[name] = FleetNode(
            name=name,
            scheduler="slurm",
            partitions=(partition,) if partition else (),
            state=base,
            flags=flags,
            reason=None if reason in ("", "none", "(null)") else reason,
            user=None if user in ("", "Unknown", "(null)") else user,
            since=parse_slurm_time(when) if reason not in ("", "none") else None,
            spare=name in spare_nodes,
        )
    return list(by_name.values())


def parse_reservations(text: str, prefix: str = RESERVATION_PREFIX) -> dict[str, list[str]]:
    """``scontrol show reservation -o`` -> partition -> the nodes of watchd's spare reservation."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"ReservationName=(\S+)", line.strip())
        if m is None or not m.group(1).startswith(prefix):
            continue
        nodes = re.search(r" Nodes=(\S+)", line)
        partition = m.group(1)[len(prefix) :]
        out[partition] = expand_hostlist(nodes.group(1)) if nodes and nodes.group(1) != "(null)" else []
    return out


class SlurmFleet:
    """The :class:`~watchd.integrations.fleet.FleetBackend` of a :class:`SlurmScheduler`."""

    name = "slurm"

    def __init__(self, scheduler: SlurmScheduler, users: str = "root") -> None:
        self.scheduler = scheduler
        self.reservation_users = users

    async def fleet_nodes(self) -> list[FleetNode]:
        spares = await self.spares()
        _, out, _ = await self.scheduler.command(self.scheduler.sinfo, "-N", "-h", "-o", SINFO_FORMAT)
        return parse_sinfo_nodes(out, spares)

    async def spares(self) -> dict[str, list[str]]:
        rc, out, err = await self.scheduler.command(
            self.scheduler.scontrol, "show", "reservation", "-o", check=False
        )
        if rc != 0 and "No reservations" not in out + err:
            raise SchedulerError(f"scontrol show reservation: exit status {rc}: {err.strip() or out.strip()}")
        return parse_reservations(out)

    async def set_spares(self, partition: str, nodes: Sequence[str]) -> None:
        name = f"{RESERVATION_PREFIX}{partition}"
        current = await self.spares()
        scontrol = self.scheduler.scontrol
        if not nodes:
            if partition in current:
                await self.scheduler.command(scontrol, "delete", f"ReservationName={name}")
            return
        hostlist = compress_hostlist(nodes)
        if partition in current:
            await self.scheduler.command(scontrol, "update", f"ReservationName={name}", f"Nodes={hostlist}")
            return
        await self.scheduler.command(
            scontrol,
            "create",
            "reservation",
            f"ReservationName={name}",
            f"Nodes={hostlist}",
            f"PartitionName={partition}",
            "StartTime=now",
            "Duration=UNLIMITED",
            f"Users={self.reservation_users}",
        )

    async def pending(self, jobs: Sequence[str]) -> set[str]:
        """``squeue -h -j IDS -t PENDING -o %i``: a job that ended is not listed, and when none of the ids is
        known any more squeue answers "Invalid job id specified" (exit 1): none is pending then."""
        if not jobs:
            return set()
        rc, out, err = await self.scheduler.command(
            self.scheduler.squeue, "-h", "-j", ",".join(jobs), "-t", "PENDING", "-o", "%i", check=False
        )
        if rc != 0:
            if "Invalid job id" in err:
                return set()
            raise SchedulerError(f"squeue -j: exit status {rc}: {err.strip() or out.strip()}")
        return {line.strip() for line in out.splitlines()} & set(jobs)


def fleet_of(scheduler: SlurmScheduler) -> SlurmFleet:
    return SlurmFleet(scheduler)
