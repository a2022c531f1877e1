"""Training-stack kinds: what PyTorch's NCCL process group, NCCL itself and the Flight Recorder
say about a hang, read from the job's own output (:mod:`watchd.trainlog`).

``collective_timeout``  the watchdog caught a collective that ran past its timeout (one rank, one sequence)
``collective_report``   the watchdog's other reports: work status (last enqueued / completed), "Some NCCL
                        operations have failed or timed out", heartbeat monitor, desync debug, exceptions
``tcpstore_error``      a TCPStore (rendezvous store) failure
``nccl_warn``           an ``NCCL WARN`` line or NCCL error text: NET/IB completion errors, Cuda failure,
                        unhandled system error, remote process exited, socket errors
``nccl_ras``            a line of an NCCL RAS (``ncclras``) report that says something is wrong
``flight_recorder``     one rank's Flight Recorder dump, summarized per process group

Every text field is bounded by the parser (:data:`MAX_TEXT`); ``job`` is the job whose output the line came
from when the source knows it (Slurm output files, pod logs), else absent. ``gathered`` is true for a line
read from a Slurm job's output file: that file gathers what the job's tasks printed on all its nodes, so the
line is not the reading node's own (:mod:`watchd.detect.attribution` says whose it is).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from watchd.model.events import Scalar
from watchd.model.kinds import Attrs

__all__ = [
    "KINDS",
    "MAX_TEXT",
    "SOURCE",
    "CollectiveReport",
    "CollectiveTimeout",
    "FlightRecord",
    "NcclRas",
    "NcclWarn",
    "TcpStoreError",
]

SOURCE = "trainlog"
MAX_TEXT = 512  # the longest text field a training-log event carries (raw lines are cut to it)


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveTimeout(Attrs):
    KIND: ClassVar[str] = "collective_timeout"

    rank: int
    seq: int  # WorkNCCL SeqNum
    op: str  # OpType: ALLREDUCE, _REDUCE_SCATTER_BASE, BROADCAST ...
    timeout_ms: int
    ran_ms: int  # how long it ran before the watchdog caught it
    numel_in: int | None = None  # absent in PyTorch < 2.0
    numel_out: int | None = None
    job: str | None = None
    gpu: int | None = None  # the local rank's GPU, where the source knows it
    pg: str | None = None
    raw: str | None = None
    gathered: bool | None = None  # read from the job's output file, which every node's tasks write
    extra: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveReport(Attrs):
    """``report``: work_status | failed_or_timed_out | heartbeat_monitor | watchdog_stuck | desync |
    watchdog_exception."""

    KIND: ClassVar[str] = "collective_report"

    report: str
    rank: int | None = None
    seq: int | None = None  # the work the watchdog failed at
    last_enqueued: int | None = None
    last_completed: int | None = None
    stuck_s: int | None = None  # heartbeat monitor: how long the watchdog made no progress
    ranks: str | None = None  # desync: the ranks named (comma-separated, bounded)
    detail: str | None = None
    job: str | None = None
    gpu: int | None = None
    pg: str | None = None
    raw: str | None = None
    gathered: bool | None = None  # read from the job's output file, which every node's tasks write
    extra: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class TcpStoreError(Attrs):
    KIND: ClassVar[str] = "tcpstore_error"

    error: str  # the failure's text (Connection reset by peer, Failed to recv ...)
    operation: str | None = None  # recvValue, recvValueWithTimeout, "should dump" check ...
    remote: str | None = None  # host:port of the store
    rank: int | None = None
    job: str | None = None
    raw: str | None = None
    gathered: bool | None = None  # read from the job's output file, which every node's tasks write
    extra: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclWarn(Attrs):
    """``category``: ib_completion | cuda_failure | system_error | remote_error | socket | other.
    ``gpu``: the CUDA device NCCL printed (``[N]``); ``device``: the NIC (``mlx5_0``, or the peer's GID
    interface ``ib0``) and ``port`` where the line names them."""

    KIND: ClassVar[str] = "nccl_warn"

    category: str
    message: str
    host: str | None = None  # the host NCCL printed
    pid: int | None = None
    gpu: int | None = None
    peer: str | None = None
    status: int | None = None  # ibv_wc_status (12 = retry exceeded, 5 = flush error ...)
    opcode: int | None = None
    vendor_err: int | None = None
    direction: str | None = None  # Send | Recv
    device: str | None = None
    port: int | None = None
    cuda_error: int | None = None
    rank: int | None = None
    job: str | None = None
    raw: str | None = None
    gathered: bool | None = None  # read from the job's output file, which every node's tasks write
    extra: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclRas(Attrs):
    """``what``: comm_status (a Communicators row whose status or errors is not OK) | op_count (``N ranks
    have launched up to operation M``) | rank (``Rank R -- GPU g managed by process p on node X``)."""

    KIND: ClassVar[str] = "nccl_ras"

    what: str
    status: str | None = None
    errors: str | None = None
    ranks: int | None = None
    operation: int | None = None
    rank: int | None = None
    gpu: int | None = None
    pid: int | None = None
    node_addr: str | None = None
    job: str | None = None
    raw: str | None = None
    gathered: bool | None = None  # read from the job's output file, which every node's tasks write
    extra: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class FlightRecord(Attrs):
    """One rank's Flight Recorder dump, for one process group: the last collective sequence enqueued,
    started and completed (-1: none), and the first one not completed."""

    KIND: ClassVar[str] = "flight_recorder"

    rank: int
    pg: str
    last_enqueued: int
    last_started: int
    last_completed: int
    pending_op: str | None = None  # the profiling name of the oldest entry not completed
    pending_seq: int | None = None
    entries: int | None = None
    format: str | None = None  # json | pickle
    version: str | None = None
    path: str | None = None
    job: str | None = None
    extra: Mapping[str, Scalar] = field(default_factory=dict)


KINDS: tuple[type[Attrs], ...] = (
    CollectiveTimeout,
    CollectiveReport,
    TcpStoreError,
    NcclWarn,
    NcclRas,
    FlightRecord,
)
