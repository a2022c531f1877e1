"""What a usage report is made of: accounting records, fair-share rows, pending jobs, what watchd
observed itself on each GPU, infrastructure faults, and the report's rows. Plain data; times are float
seconds since the epoch, GPU-hours are GPU count x hours."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Group-by dimensions a report may be cut by.
DIMENSIONS = ("account", "user", "partition")
UNKNOWN = "(unknown)"


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One run of a job in accounting (``sacct -D``: a requeued job has one record per run)."""

    job_id: str
    account: str
    user: str
    partition: str
    gpus: int
    submit: float
    start: float | None  # None: never started
    end: float | None  # None: still running
    state: str  # COMPLETED, FAILED, REQUEUED, NODE_FAIL, RUNNING, ... (without "by <uid>")
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ShareRecord:
    """One association of ``sshare``: an account (``user`` None) or a user in an account."""

    account: str
    user: str | None
    raw_shares: int | None
    norm_shares: float | None
    raw_usage: float | None
    effective_usage: float | None
    fairshare: float | None  # the user association's fair-share factor (sshare FairShare)
    level_fs: float | None  # the association's LevelFS (fair-tree), inf when it used nothing


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: str
    account: str
    user: str
    partition: str
    gpus: int
    submit: float
    reason: str


@dataclass(frozen=True, slots=True)
class GpuUse:
    """What watchd's agents reported for one job on one GPU, summed over the job's windows there."""

    job: str  # bare Slurm job id (``slurm:`` stripped) or another scheduler's label
    node: str
    gpu: int
    energy_j: float
    gpu_s: float  # seconds of windows observed
    idle_s: float  # seconds of windows whose mean utilization was under the idle threshold
    first: float
    last: float
    account: str | None = None  # as the engine's job list knew it (used when accounting is unavailable)
    partition: str | None = None
    user: str | None = None


@dataclass(frozen=True, slots=True)
class Fault:
    """Infrastructure evidence from watchd's audit: it drained ``node``, or requeued ``jobs`` on it, at
    ``at``."""

    node: str
    at: float
    kind: str  # "drain" | "requeue"
    jobs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Accounting:
    """What the accounting source answered for a window; ``available`` False says why in ``why``."""

    available: bool
    why: str = ""
    jobs: tuple[JobRecord, ...] = ()
    shares: tuple[ShareRecord, ...] = ()
    pending: tuple[PendingJob, ...] = ()
    source: str = ""


@dataclass(frozen=True, slots=True)
class Observed:
    """What watchd observed itself (its state database): GPU use per job and GPU, checkpoints, faults."""

    gpus: tuple[GpuUse, ...] = ()
    checkpoints: dict[str, tuple[float, ...]] = field(default_factory=dict)  # job -> sorted times
    faults: tuple[Fault, ...] = ()


@dataclass(slots=True)
class UsageRow:
    """One group of the report (an account; an account and user; ...)."""

    key: dict[str, str]
    gpu_hours: float = 0.0
    jobs: int = 0
    usage_fraction: float = 0.0  # of the window's GPU-hours in the report
    norm_shares: float | None = None
    effective_usage: float | None = None
    fairshare: float | None = None
    level_fs: float | None = None
    waits_n: int = 0
    wait_p50_s: float | None = None
    wait_p95_s: float | None = None
    wait_max_s: float | None = None
    pending: int = 0
    pending_gpus: int = 0
    pending_wait_max_s: float | None = None
    pending_reasons: dict[str, int] = field(default_factory=dict)
    energy_kwh: float | None = None
    observed_gpu_hours: float | None = None
    idle_gpu_hours: float | None = None
    lost_gpu_hours: float = 0.0
    lost_jobs: int = 0


@dataclass(slots=True)
class LostJob:
    job_id: str
    account: str
    gpus: int
    start: float
    end: float
    since: float  # the last checkpoint, else the run's start
    since_what: str  # "checkpoint" | "start"
    evidence: str  # "node_fail" | "requeue" | "drain"
    gpu_hours: float


@dataclass(slots=True)
class UsageReport:
    start: float
    end: float
    by: tuple[str, ...]
    accounting: bool
    accounting_note: str
    rows: list[UsageRow]
    total_gpu_hours: float
    idle_util_pct: float
    #: account -> GPU-hours per bucket (the buckets' start times in ``bucket_starts``) for the plots
    series: dict[str, list[float]] = field(default_factory=dict)
    bucket_starts: list[float] = field(default_factory=list)
    #: account -> counts of finished jobs' waits per bucket of WAIT_EDGES_S
    wait_histograms: dict[str, list[int]] = field(default_factory=dict)
    lost_jobs: list[LostJob] = field(default_factory=list)
    pending: list[PendingJob] = field(default_factory=list)


#: upper edges (seconds) of the wait histogram's buckets; the last bucket is everything longer
WAIT_EDGES_S: tuple[float, ...] = (10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400)
WAIT_LABELS: tuple[str, ...] = ("<10s", "<1m", "<5m", "<15m", "<1h", "<4h", "<12h", "<1d", ">=1d")
