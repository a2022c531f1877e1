"""What the training stack of a simulated job writes when it hangs, with the delays it really has:
the lines a :class:`~watchd.sim.jobs.JobRun` would print, as the events the agent makes of them.

* ``hang_nic``: NET/IB completion errors (status 12, retry exceeded) on the culprit's NIC once the IB
  transport gives up (``NCCL_IB_TIMEOUT``/``NCCL_IB_RETRY_CNT`` defaults: ~10-30 s after the link fails);
  in a third of the runs a peer node logs a flush error (status 5) as well, so the NIC is not always clear;
* ``hang_lost``: the culprit rank's process dies with a CUDA error seconds after its GPU is lost;
* every hang: after the watchdog timeout (``timeout_s``, PyTorch's default 600 s) each rank that entered the
  stuck collective reports the timeout and its work status (last enqueued / completed), within ~2 s of each
  other; with ``TORCH_NCCL_DUMP_ON_TIMEOUT`` every live rank dumps its Flight Recorder trace a few seconds
  later (the culprit stuck in compute never enqueued the collective: its dump shows it). Lines are read
  ~0.5 s after they are written; a dump is read after the agent's poll (5 s) saw it hold still (another 5 s).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from watchd.model.events import Event, stable_id
from watchd.model.kinds import Attrs
from watchd.model.trainlog import CollectiveReport, CollectiveTimeout, FlightRecord, NcclWarn
from watchd.sim.jobs import JobRun

__all__ = ["DUMP_DELAY_S", "LINE_DELAY_S", "training_events"]

LINE_DELAY_S = 0.5  # written -> read by the file follower (inotify) -> shipped
DUMP_DELAY_S = 10.0  # a dump is read once it held still for one poll


def _event(run: JobRun, node: str, t: float, record: Attrs, n: int) -> Event:
    return record.to_event(
        id=stable_id(run.job, node, record.KIND, n), node=node, source="slurm-jobs", time=t
    )


def training_events(run: JobRun, timeout_s: float = 600.0, dump: bool = True) -> Iterator[Event]:
    """The run's training-log events, each at the time the agent reads it (not in time order)."""
    if not run.fault.startswith("hang"):
        return
    rng = random.Random(run.seed * 7919 + 17)
    fault = run.start + run.fault_at
    seq = 1000 + int(run.fault_at)  # the collective that hangs
    gpus = run.gpus_per_node
    culprit_rank = run.culprit[0] * gpus + run.culprit[1]
    n = 0
    if run.fault == "hang_nic":
        node = run.culprit_node
        for i in range(rng.randint(1, 3)):
            n += 1
            warn = NcclWarn(
                category="ib_completion",
                message="NET/IB : Got completion from peer with status=12 opcode=0 len=0 vendor err 129",
                gpu=run.culprit[1],
                status=12,
                vendor_err=129,
                direction="Send",
                device=f"mlx5_{run.culprit[1]}",
                job=run.job,
            )
            yield _event(run, node, fault + rng.uniform(10.0, 30.0) + i + LINE_DELAY_S, warn, n)
        if run.nodes > 1 and rng.random() < 1 / 3:
            peer = run.node_name((run.culprit[0] + 1) % run.nodes)
            n += 1
            flush = NcclWarn(
                category="ib_completion", message="flush error", gpu=0, status=5, vendor_err=249, job=run.job
            )
            yield _event(run, peer, fault + rng.uniform(12.0, 35.0) + LINE_DELAY_S, flush, n)
    dead = run.fault == "hang_lost"
    if dead:
        n += 1
        crash = CollectiveReport(
            report="watchdog_exception",
            rank=culprit_rank,
            gpu=run.culprit[1],
            job=run.job,
            detail="CUDA error: unspecified launch failure",
        )
        yield _event(run, run.culprit_node, fault + rng.uniform(1.0, 8.0) + LINE_DELAY_S, crash, n)
    entered = {r: fault + rng.uniform(0.0, 1.5) for r in range(run.nodes * gpus)}
    stuck_out = run.fault == "hang_compute"  # the culprit never enters the collective
    fired = fault + timeout_s
    for rank, started in entered.items():
        if rank == culprit_rank and (stuck_out or dead):
            continue
        node = run.node_name(rank // gpus)
        at = started + timeout_s + rng.uniform(0.0, 0.2)
        if at > run.start + run.duration_s:
            continue
        n += 1
        ran = int((at - started) * 1000)
        yield _event(
            run,
            node,
            at + LINE_DELAY_S,
            CollectiveTimeout(
                rank=rank,
                seq=seq,
                op="ALLREDUCE",
                timeout_ms=int(timeout_s * 1000),
                ran_ms=ran,
                gpu=rank % gpus,
                job=run.job,
            ),
            n,
        )
        n += 1
        status = CollectiveReport(
            report="work_status",
            rank=rank,
            seq=seq,
            last_enqueued=seq,
            last_completed=seq - 1,
            gpu=rank % gpus,
            job=run.job,
        )
        yield _event(run, node, at + 0.05 + LINE_DELAY_S, status, n)
    if not dump or fired + 5.0 + DUMP_DELAY_S > run.start + run.duration_s:
        return
    for rank in range(run.nodes * gpus):
        if dead and rank == culprit_rank:
            continue
        behind = stuck_out and rank == culprit_rank
        n += 1
        record = FlightRecord(
            rank=rank,
            pg="0",
            last_enqueued=seq - 1 if behind else seq,
            last_started=seq - 1 if behind else seq,
            last_completed=seq - 1,
            job=run.job,
        )
        yield _event(
            run, run.node_name(rank // gpus), fired + rng.uniform(2.0, 5.0) + DUMP_DELAY_S, record, n
        )
