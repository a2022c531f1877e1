"""Daemon configuration: one YAML file per daemon, validated strictly at load.

Unknown keys and bad values are rejected with the file, the key path and the reason. Secrets (the ingest
token) come from the environment or a file, so the YAML itself can be world-readable.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, field_validator, model_validator

from watchd.checks.params import ChecksConfig
from watchd.detect.params import DetectorsConfig
from watchd.errors import ConfigError
from watchd.logs import get_logger
from watchd.model.durations import parse_duration
from watchd.strict import Strict as _Strict

Seconds = Annotated[float, Field(gt=0)]
Port = Annotated[int, Field(ge=0, le=65535)]


class TokenSource(_Strict):
    """Where the shared bearer token comes from: exactly one of ``token_file``, ``token_env``, ``token``."""

    token_file: Path | None = None
    token_env: str | None = None
    token: str | None = Field(default=None, repr=False)

    @model_validator(mode="after")
    def _exactly_one(self) -> TokenSource:
        given = [n for n in ("token_file", "token_env", "token") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give only one of token_file, token_env, token (got {', '.join(given)})")
        return self

    def resolve(self) -> str | None:
        """The token, or None when authentication is switched off (no source given)."""
        if self.token is not None:
            value = self.token
        elif self.token_env is not None:
            if self.token_env not in os.environ:
                raise ConfigError(f"auth.token_env: environment variable {self.token_env} is not set")
            value = os.environ[self.token_env]
        elif self.token_file is not None:
            try:
                check_secret_file(self.token_file, "token_file")
                value = self.token_file.read_text()
            except OSError as exc:
                raise ConfigError(f"auth.token_file: cannot read {self.token_file}: {exc.strerror}") from exc
        else:
            return None
        value = value.strip()
        if not value:
            raise ConfigError("auth: the token is empty")
        return value


# --- issue 22 (security): secret files, engine credentials, TLS (docs/security.md) ---------------------


def check_secret_file(path: Path, key: str) -> None:
    """A token or key file others could change is refused (ConfigError); one others may read is accepted
    with a warning. Group- or world-writable: anyone in the group could swap the secret for their own."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o022:
        raise ConfigError(
            f"{key}: {path} is writable by {'others' if mode & 0o002 else 'its group'} (mode {mode:04o}): "
            f"anyone who can write it can swap the secret; chmod 600 {path}"
        )
    if mode & 0o004:
        get_logger("watchd.config").warning(
            "secret_file_world_readable",
            key=key,
            path=str(path),
            mode=f"{mode:04o}",
            hint=f"chmod 600 {path}",
        )


class NamedToken(TokenSource):
    """A person's (or a dashboard's) credential: the name the audit records for what it does."""

    name: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[\w.@+-]+$")]

    @model_validator(mode="after")
    def _given(self) -> NamedToken:
        if self.token_file is None and self.token_env is None and self.token is None:
            raise ValueError(f"{self.name}: give one of token_file, token_env, token")
        return self


class EngineAuth(TokenSource):
    """The engine's credentials. The shared token (``token_file``/``token_env``/``token``) is the agents'
    (ingest). ``operators``: named tokens that may release, discard and resume (the audit records the name);
    ``viewers``: named tokens that may read ``/api/v1/*``. With neither, the shared token does both (the
    name recorded is ``X-Watchd-Operator``, marked unverified). With no credential at all, everything is
    open (``make demo``): the engine logs a warning at start."""

    operators: list[NamedToken] = Field(default_factory=list)
    viewers: list[NamedToken] = Field(default_factory=list)
    open_metrics: bool = True  # /metrics without a credential (Prometheus scrapes it)
    open_health: bool = True  # /healthz and /readyz without a credential (probes, load balancers)

    @model_validator(mode="after")
    def _distinct_names(self) -> EngineAuth:
        names = [t.name for t in [*self.operators, *self.viewers]]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"auth: the name {dup[0]} is given twice (operators and viewers)")
        return self


class Listen(_Strict):
    host: str = "127.0.0.1"
    port: Port
    tls_cert: Path | None = None  # serve HTTPS with this certificate (chain) ...
    tls_key: Path | None = None  # ... and its private key
    client_ca: Path | None = None  # mutual TLS: clients must present a certificate this CA signed

    @model_validator(mode="after")
    def _tls_pair(self) -> Listen:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("listen: give tls_cert and tls_key together")
        if self.client_ca is not None and self.tls_cert is None:
            raise ValueError("listen.client_ca needs tls_cert and tls_key (mutual TLS runs over TLS)")
        return self


# --- end issue 22 ---------------------------------------------------------------------------------------


class HttpConfig(_Strict):
    """What one HTTP client may hold of a server (docs/configuration.md, "HTTP limits"): a client that sends
    its headers or its body too slowly is cut, and connections past the cap are closed on accept."""

    header_timeout_s: Seconds = 5.0  # from the connection (or the end of the previous request) to the headers
    body_timeout_s: Seconds = 5.0  # to read one request's whole body
    # each agent keeps one connection open between its batches: size this above the number of agents
    max_connections: Annotated[int, Field(ge=1)] = 16384


class LogConfig(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


# ---------------------------------------------------------------------------------------------- engine


class IngestConfig(_Strict):
    max_body_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    max_events_per_batch: Annotated[int, Field(ge=1)] = 10_000
    dedup_window_s: Seconds = 3600.0
    dedup_max_ids: Annotated[int, Field(ge=1000)] = 1_000_000
    queue_size: Annotated[int, Field(ge=1)] = 100_000
    ack_timeout_s: Seconds = 5.0  # a reply waits at most this long for its batch to be evaluated


class SchedulerSettings(_Strict):
    """The config section of one scheduler integration: an ``EngineConfig`` field of this type, named as the
    scheduler is in :data:`watchd.integrations.registry.SCHEDULERS` and in ``schedulers[].scheduler``."""

    enabled: bool = False


class SlurmConfig(SchedulerSettings):
    enabled: bool = True
    scontrol: str = "scontrol"
    squeue: str = "squeue"
    sinfo: str = "sinfo"
    slurm_conf: Path | None = None
    timeout_s: Seconds = 10.0


class EvictionConfig(_Strict):
    deadline_s: Seconds = 300.0  # a PodDisruptionBudget's 429 is retried with backoff up to this
    backoff_initial_s: Seconds = 1.0
    backoff_max_s: Seconds = 10.0
    gpu_only: bool = False  # evict only the pods that request gpu_resource
    gpu_resource: str = "nvidia.com/gpu"
    delete_after_deadline: bool = False  # delete what a budget still holds at the deadline


class LeaderElectionConfig(_Strict):
    """Several engine replicas: only the holder of a coordination.k8s.io Lease acts."""

    enabled: bool = False
    namespace: str = "watchd"
    lease_name: str = "watchd-engine"
    identity: str = Field(default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname())
    lease_duration_s: Seconds = 15.0
    renew_deadline_s: Seconds = 10.0
    retry_period_s: Seconds = 2.0

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionConfig:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("leader election needs retry_period_s < renew_deadline_s < lease_duration_s")
        return self


class KubernetesConfig(SchedulerSettings):
    kubeconfig: Path | None = None  # None: the pod's service account in a cluster, else $KUBECONFIG
    context: str | None = None
    in_cluster: bool | None = None  # None: detect (KUBERNETES_SERVICE_HOST set and no kubeconfig)
    timeout_s: Seconds = 10.0
    pool_label: str = "nvidia.com/gpu.product"  # the blast-radius breaker counts per value of this label
    node_selector: str | None = None  # label selector of the nodes watchd manages (pools)
    taint_key: str = Field(
        default="watchd.io/gpu-fault", pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9][-A-Za-z0-9_.]*$"
    )
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    eviction: EvictionConfig = EvictionConfig()
    requeue: Literal["delete", "annotate"] = "delete"
    max_concurrency: Annotated[int, Field(ge=1)] = 16
    leader_election: LeaderElectionConfig = LeaderElectionConfig()


class FakeSchedulerConfig(SchedulerSettings):
    """The in-memory scheduler (demos, trying rules against named nodes): it drains and resumes in memory
    only, with Slurm's semantics, and touches nothing."""

    nodes: list[str] = Field(default_factory=list)
    partitions: dict[str, list[str]] = Field(default_factory=dict)  # empty: one pool "all" of every node


class SchedulerRoute(_Strict):
    """Which nodes one scheduler acts on (shell patterns on the node name); a node may match several."""

    scheduler: str  # a scheduler section of the engine config: slurm, kubernetes, fake
    nodes: list[str] = Field(default_factory=lambda: ["*"], min_length=1)


class ActionsConfig(_Strict):
    cooldown_s: Annotated[float, Field(ge=0)] = 600.0
    max_concurrent: Annotated[int, Field(ge=1)] = 1024


class SafetyConfig(_Strict):
    max_fraction: Annotated[float, Field(gt=0, le=1)] = 0.10
    max_nodes: Annotated[int, Field(ge=1)] = 50
    window_s: Seconds = 3600.0
    pools_refresh_s: Seconds = 60.0


# --- issue 22 (HA): the PostgreSQL store shared by engines, and its database lease -------------------------
class DatabaseLeaseConfig(_Strict):
    """Engines sharing a PostgreSQL store elect a leader through a lease row in it; its fencing token is
    checked by every write and right before every side effect (watchd/integrations/dblease.py)."""

    enabled: bool = False
    lease_name: str = Field(default="watchd-engine", min_length=1)
    identity: str = Field(
        default_factory=lambda: f"{os.environ.get('POD_NAME') or socket.gethostname()}-{os.getpid()}",
        min_length=1,
    )
    lease_duration_s: Seconds = 15.0
    renew_deadline_s: Seconds = 10.0
    retry_period_s: Seconds = 2.0

    @model_validator(mode="after")
    def _ordered(self) -> DatabaseLeaseConfig:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("leader election needs retry_period_s < renew_deadline_s < lease_duration_s")
        return self


def _secret(key: str, env: str | None, file: Path | None) -> str | None:
    if env is not None:
        if env not in os.environ:
            raise ConfigError(f"{key}_env: environment variable {env} is not set")
        value = os.environ[env]
    elif file is not None:
        try:
            value = file.read_text()
        except OSError as exc:
            raise ConfigError(f"{key}_file: cannot read {file}: {exc.strerror}") from exc
    else:
        return None
    value = value.strip()
    if not value:
        raise ConfigError(f"{key}: empty")
    return value


class PostgresConfig(_Strict):
    """The connection (a libpq connection string or URI, from exactly one of ``dsn``, ``dsn_env``,
    ``dsn_file``; its password apart, from ``password_env`` or ``password_file``, or ~/.pgpass)."""

    dsn: str | None = None
    dsn_env: str | None = None
    dsn_file: Path | None = None
    password_env: str | None = None
    password_file: Path | None = None
    connect_timeout_s: Seconds = 5.0
    lock_timeout_s: Seconds = 1.0  # a write waits this long for a lock held by someone else
    statement_timeout_s: Seconds = 5.0  # a stalled server fails the statement (the store is sync on the loop)
    leader_election: DatabaseLeaseConfig = DatabaseLeaseConfig()

    @model_validator(mode="after")
    def _sources(self) -> PostgresConfig:
        dsn = [n for n in ("dsn", "dsn_env", "dsn_file") if getattr(self, n) is not None]
        if len(dsn) > 1:
            raise ValueError(f"give only one of dsn, dsn_env, dsn_file (got {', '.join(dsn)})")
        if self.password_env is not None and self.password_file is not None:
            raise ValueError("give only one of password_env, password_file")
        return self

    def resolve(self) -> tuple[str, str | None]:
        """(connection string, password or None); ConfigError naming the key when one cannot be read."""
        dsn = self.dsn or _secret("state.postgres.dsn", self.dsn_env, self.dsn_file)
        if not dsn:
            raise ConfigError("state.postgres: give one of dsn, dsn_env, dsn_file")
        return dsn, _secret("state.postgres.password", self.password_env, self.password_file)


class StateConfig(_Strict):
    kind: Literal["sqlite", "postgres"] = "sqlite"  # postgres: shared by engines (HA, issue 22)
    path: Path | None = None  # sqlite; None: in memory (not durable; the shipped config sets a file)
    postgres: PostgresConfig = PostgresConfig()
    audit_retention_days: Annotated[float, Field(gt=0)] = 90.0
    rules_snapshot_s: Seconds = 10.0  # how often what the rules remember is saved (and at shutdown)

    @model_validator(mode="after")
    def _one_kind(self) -> StateConfig:
        pg = self.postgres
        if self.kind == "postgres":
            if self.path is not None:
                raise ValueError("path: a SQLite file; with kind: postgres give postgres.dsn instead")
            if pg.dsn is None and pg.dsn_env is None and pg.dsn_file is None:
                raise ValueError("kind postgres: give postgres.dsn, postgres.dsn_env or postgres.dsn_file")
        elif pg.dsn or pg.dsn_env or pg.dsn_file or pg.leader_election.enabled:
            raise ValueError("postgres: set kind: postgres to use it (the store is SQLite)")
        return self


class AlertmanagerConfig(_Strict):
    urls: list[Annotated[str, Field(pattern=r"^https?://")]] = Field(default_factory=list)
    resend_interval_s: Seconds = 60.0
    timeout_s: Seconds = 5.0


class ReloadConfig(_Strict):
    watch_files: bool = True
    poll_interval_s: Seconds = 2.0


class JobsConfig(_Strict):
    """Job topology: which nodes and GPUs each job runs on (from the scheduler and from the agents)."""

    refresh_s: Seconds = 30.0  # the scheduler's job list (squeue --json) is read this often ...
    min_refresh_s: Seconds = 5.0  # ... and sooner, at most this often, when agents report an unknown job
    member_ttl_s: Seconds = 60.0  # an agent's report of a GPU's job counts this long


class ReliabilityConfig(_Strict):
    """Reliability accounting and checkpoint advice (issue 17; docs/reliability.md)."""

    gap_s: Seconds = 300.0  # a node silent longer than this is not in service meanwhile
    # nodes whose service is tracked in memory; the least recently seen forgotten first (its open interval
    # is closed and saved), like the detectors' fleet state (detectors.max_nodes)
    max_nodes: Annotated[int, Field(ge=1)] = 131_072
    flush_s: Seconds = 60.0  # service intervals are saved this often (a crash loses at most this much)
    interval_s: Seconds = 60.0  # the advice, its findings and the metrics are refreshed this often
    confidence: Annotated[float, Field(gt=0, lt=1)] = 0.9  # of the MTBF interval (two-sided)
    window_days: Annotated[float, Field(gt=0)] = 90.0  # the accounting's default window (--since)
    retention_days: Annotated[float, Field(gt=0)] = 730.0
    lemon_failures: Annotated[int, Field(ge=1)] = 2  # failures within lemon_window_days make a lemon
    lemon_window_days: Annotated[float, Field(gt=0)] = 28.0
    checkpoint_cost_s: Seconds | None = None  # C when a job's heartbeats do not time its checkpoints
    restart_s: Annotated[float, Field(ge=0)] = 0.0  # R in Daly's model: restart time after a failure
    assumed_node_mtbf_hours: Annotated[float, Field(gt=0)] | None = None  # before any exposure is measured
    far_factor: Annotated[float, Field(gt=1)] = 3.0  # interval > factor x advised: a finding
    finding_repeat_s: Seconds = 21600.0  # at most one finding per job this often
    metrics_lemons: Annotated[int, Field(ge=0, le=100)] = 20  # lemons exported by name, at most
    metrics_jobs: Annotated[int, Field(ge=0, le=10000)] = 500  # jobs exported by label, at most


# issue 17: the whole fleet's drains (`watchd drains`) and the hot spares
class DrainsConfig(_Strict):
    """The engine's poll of every node of the fleet (docs/drains.md)."""

    enabled: bool = True
    poll_s: Seconds = 60.0  # how often every node is listed (sinfo -N; the Node objects)
    alert_after_s: Seconds = (
        3 * 86400.0
    )  # a node out longer than this is overdue: node_unavailable overdue=true
    remind_every_s: Seconds = 86400.0  # an overdue node is reported again this often


class SparesConfig(_Strict):
    """Hot spares: idle nodes kept out of normal scheduling per partition, released when watchd requeues
    the jobs of a node it drained (docs/drains.md)."""

    partitions: dict[str, Annotated[int, Field(ge=0, le=10_000)]] = Field(default_factory=dict)
    slurm_users: str = Field(default="root", pattern=r"^[A-Za-z0-9_.,-]+$")  # Users= of the reservation
    # a spare released for requeued jobs stays theirs (the partition is not topped up) until they run again
    # or this long: past Slurm's cred_expire (120 s by default), the delay before a requeued job may start
    keep_for_requeued_s: Annotated[float, Field(ge=0, le=86400)] = 600.0


class ReportsConfig(_Strict):
    """Issue 18: per-team usage, waits, energy and lost GPU-hours (docs/reports.md)."""

    observe: bool = True  # record energy and idle time per job GPU and the jobs' checkpoints in the state
    metrics: bool = False  # publish watchd_usage_* (reads Slurm accounting every metrics_interval_s)
    source: Literal["slurm", "none"] = "slurm"  # none: no slurmdbd, only what watchd observed
    window: Annotated[float, BeforeValidator(parse_duration)] = 7 * 86400.0  # the metrics' window
    metrics_interval_s: Annotated[float, Field(ge=10)] = 300.0
    idle_util_pct: Annotated[float, Field(ge=0, le=100)] = 5.0  # a GPU window under this is idle
    max_accounts: Annotated[int, Field(ge=1, le=10_000)] = 50  # accounts with own series; the rest: (other)
    per_user: bool = False  # also a user label on the metrics (bounded by max_accounts accounts)
    timeout_s: Seconds = 300.0  # for each of sacct, sshare, squeue
    retention_days: Annotated[float, Field(gt=0)] = 90.0  # observations kept in the state database


class EngineConfig(_Strict):
    listen: Listen = Listen(port=9120)
    http: HttpConfig = HttpConfig()
    external_url: str = ""
    auth: EngineAuth = EngineAuth()
    mode: Literal["dry-run", "enforce"] = "dry-run"
    rules: list[Path] = Field(default_factory=list)
    reload: ReloadConfig = ReloadConfig()
    ingest: IngestConfig = IngestConfig()
    slurm: SlurmConfig = SlurmConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    fake: FakeSchedulerConfig = FakeSchedulerConfig()
    schedulers: list[SchedulerRoute] = Field(default_factory=list)
    actions: ActionsConfig = ActionsConfig()
    safety: SafetyConfig = SafetyConfig()
    state: StateConfig = StateConfig()
    alertmanager: AlertmanagerConfig = AlertmanagerConfig()
    jobs: JobsConfig = JobsConfig()
    detectors: DetectorsConfig = DetectorsConfig()
    checks: ChecksConfig = ChecksConfig()  # issue 21: active checks (docs/checks.md)
    reliability: ReliabilityConfig = ReliabilityConfig()
    drains: DrainsConfig = DrainsConfig()  # issue 17
    spares: SparesConfig = SparesConfig()  # issue 17
    log: LogConfig = LogConfig()
    reports: ReportsConfig = ReportsConfig()  # issue 18

    @model_validator(mode="after")
    def _one_election(self) -> EngineConfig:  # issue 22: the database lease fences the shared store
        if self.state.kind == "postgres" and self.kubernetes.leader_election.enabled:
            raise ValueError(
                "kubernetes.leader_election: with state.kind postgres the engines elect through the database "
                "lease (state.postgres.leader_election), whose token fences the store's writes"
            )
        return self

    @field_validator("auth", mode="before")
    @classmethod
    def _shared_token_only(cls, value: Any) -> Any:
        # a plain TokenSource (the shared token alone, as before issue 22) is an EngineAuth with no roles
        if isinstance(value, TokenSource) and not isinstance(value, EngineAuth):
            return value.model_dump(exclude_unset=True)
        return value

    def scheduler_settings(self) -> dict[str, SchedulerSettings]:
        """Every scheduler section, by scheduler name (the field's name), enabled or not."""
        return {name: getattr(self, name) for name in scheduler_names()}

    @model_validator(mode="after")
    def _routes_name_enabled_schedulers(self) -> EngineConfig:
        sections = self.scheduler_settings()
        for i, route in enumerate(self.schedulers):
            if route.scheduler not in sections:
                raise ValueError(
                    f"schedulers.{i}.scheduler: unknown scheduler {route.scheduler!r} "
                    f"(known: {', '.join(sorted(sections))})"
                )
            if not sections[route.scheduler].enabled:
                raise ValueError(
                    f"schedulers.{i}: {route.scheduler} is not enabled ({route.scheduler}.enabled)"
                )
        enabled = [name for name, section in sections.items() if section.enabled]
        if len(enabled) > 1 and not self.schedulers:
            names = f"{', '.join(enabled[:-1])} and {enabled[-1]}"
            example = ", ".join(f"{{scheduler: {name}}}" for name in enabled)
            raise ValueError(
                f"{names} are {'both ' if len(enabled) == 2 else ''}enabled: say which nodes each acts on in "
                f"schedulers: ({'both' if len(enabled) == 2 else 'all'} on every node: [{example}])"
            )
        return self


def scheduler_names() -> tuple[str, ...]:
    """The engine config's scheduler sections: its fields whose type is a :class:`SchedulerSettings`."""
    return tuple(
        name
        for name, field in EngineConfig.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, SchedulerSettings)
    )


# ----------------------------------------------------------------------------------------------- agent


class KmsgConfig(_Strict):
    enabled: bool = True
    path: Path = Path("/dev/kmsg")
    state_file: Path | None = Path("/var/lib/watchd/kmsg.state")


class FileSourceConfig(_Strict):
    path: Path
    poll_interval_s: Seconds = 0.5
    # who may write the file decides what it says: any local user can put a kernel-looking line in
    # /var/log/syslog (logger -t kernel). "untrusted": its Xid lines are counted, never evidence;
    # "any-writer": you vouch that only the kernel's lines can reach it (docs/security.md)
    trust: Literal["untrusted", "any-writer"] = "untrusted"


class JournaldConfig(_Strict):
    """The kernel's lines from the systemd journal (``_TRANSPORT=kernel`` only; docs/security.md)."""

    enabled: bool = False
    journalctl: str = "journalctl"
    directory: Path | None = None  # a journal folder (default: the system journal)
    cursor_file: Path | None = Path("/var/lib/watchd/journald.cursor")


class GpuSourceConfig(_Strict):
    backend: Literal["nvml", "dcgm", "fake", "none"] = "nvml"
    interval_s: Seconds = 2.0
    summary_window_s: Seconds = 5.0
    health_report_interval_s: Seconds = 30.0
    scenario: Path | None = None  # backend fake: a GPU scenario file (tests, demos, the simulator)
    dcgm_url: Annotated[str, Field(pattern=r"^https?://")] = "http://127.0.0.1:9400/metrics"
    xid_dedup_window_s: Seconds = 10.0
    proc_root: Path = Path("/proc")
    # nvml backend cadences (issue 20, docs/gpu-nvml-cost.md): slow-changing fields, and the energy counter
    # (4 ms CPU a read on an H200; the power integral in between)
    nvml_slow_interval_s: Seconds = 10.0
    nvml_energy_interval_s: Annotated[float, Field(ge=1.0, le=300.0)] = 30.0

    @model_validator(mode="after")
    def _scenario_for_fake(self) -> GpuSourceConfig:
        if self.backend == "fake" and self.scenario is None:
            raise ValueError("backend fake needs a scenario file")
        return self


# issue 19: where the training stack's own output is read (docs/training-logs.md)
class TrainingLogsConfig(_Strict):
    slurm_jobs: bool = False  # follow the StdOut/StdErr files of the Slurm jobs running on this node
    slurm_node: str | None = None  # this node's name in Slurm (default: the agent's node)
    slurm_conf: Path | None = None  # SLURM_CONF for squeue/scontrol (default: theirs)
    slurm_poll_s: Seconds = 15.0
    pods_dir: Path | None = None  # e.g. /var/log/pods: follow the containers' logs
    pods_poll_s: Seconds = 10.0
    journald_units: list[str] = Field(default_factory=list)
    journalctl: str = "journalctl"
    flight_recorder_dirs: list[Path] = Field(default_factory=list)
    flight_recorder_prefix: str = Field(default="nccl_trace_rank_", min_length=1, max_length=128)
    flight_recorder_poll_s: Seconds = 5.0
    max_files: Annotated[int, Field(ge=1, le=4096)] = 64
    max_events_per_minute: Annotated[int, Field(ge=1)] = 120  # per job and kind; more are dropped, counted


class SourcesConfig(_Strict):
    kmsg: KmsgConfig = KmsgConfig()
    journald: JournaldConfig = JournaldConfig()
    files: list[FileSourceConfig] = Field(default_factory=list)
    gpu: GpuSourceConfig = GpuSourceConfig()
    training: TrainingLogsConfig = TrainingLogsConfig()  # issue 19


class EngineEndpoint(_Strict):
    url: Annotated[str, Field(pattern=r"^https?://[^\s/]+")] = "http://127.0.0.1:9120"
    auth: TokenSource = TokenSource()
    timeout_s: Seconds = 5.0
    ca_file: Path | None = None  # https: trust this CA (default: the system's)
    client_cert: Path | None = None  # mutual TLS: the agent's certificate ...
    client_key: Path | None = None  # ... and its key

    @model_validator(mode="after")
    def _tls(self) -> EngineEndpoint:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("engine: give client_cert and client_key together")
        tls = self.ca_file is not None or self.client_cert is not None
        if tls and not self.url.startswith("https://"):
            raise ValueError("engine: ca_file/client_cert need an https:// url")
        return self


class ShipperConfig(_Strict):
    max_batch: Annotated[int, Field(ge=1)] = 1000
    queue_size: Annotated[int, Field(ge=1)] = 100_000
    backoff_initial_s: Seconds = 0.2
    backoff_max_s: Seconds = 30.0
    shutdown_flush_s: Annotated[float, Field(ge=0)] = 5.0


class HeartbeatConfig(_Strict):
    """The local endpoint where training ranks report their progress (docs/heartbeats.md). On by default: it
    costs nothing until a rank reports, and an endpoint that cannot be opened is logged and counted, never
    fatal."""

    enabled: bool = True
    socket: Path | None = Path("/run/watchd/heartbeat.sock")  # None: no Unix socket
    # who may report: "0660" the agent's user and group, "0666" every local user (loopback HTTP already is)
    socket_mode: Annotated[str, Field(pattern=r"^0?[0-7]{3}$")] = "0660"
    # on 127.0.0.1 only; 0: off. With verify, each job needs its token (token_secret; docs/security.md)
    http_port: Port = 0
    # reports count only from the job they name (the socket peer's cgroup, or the job's token over TCP);
    # false: any local process may report for any job (before issue 22; not for production)
    verify: bool = True
    token_secret: TokenSource = TokenSource()  # the node secret the per-job TCP tokens derive from
    identity: Literal["proc", "fake"] = "proc"  # who a socket peer is: /proc/<pid>/cgroup (fake: tests)
    proc_root: Path = Path("/proc")
    max_ranks_per_job: Annotated[int, Field(ge=1)] = 512  # per verified job or pod
    forward_interval_s: Seconds = 2.0
    max_ranks: Annotated[int, Field(ge=1)] = 1024
    forget_after_s: Seconds = 600.0
    http: HttpConfig = HttpConfig(max_connections=256)  # both endpoints (socket and 127.0.0.1)

    @model_validator(mode="after")
    def _tcp_needs_tokens(self) -> HeartbeatConfig:
        secret = self.token_secret
        given = secret.token_file or secret.token_env or secret.token
        if self.verify and self.http_port and not given:
            raise ValueError(
                "heartbeat.http_port with verify needs heartbeat.token_secret (per-job tokens, "
                "docs/security.md); or use the Unix socket (http_port: 0)"
            )
        return self


class AgentConfig(_Strict):
    # NODE_NAME: the Kubernetes node name from the downward API (the DaemonSet sets it)
    node: str = Field(
        default_factory=lambda: os.environ.get("NODE_NAME") or socket.gethostname().split(".")[0]
    )
    engine: EngineEndpoint = EngineEndpoint()
    listen: Listen = Listen(port=9121)
    sources: SourcesConfig = SourcesConfig()
    heartbeat: HeartbeatConfig = HeartbeatConfig()
    shipper: ShipperConfig = ShipperConfig()
    log: LogConfig = LogConfig()


# ----------------------------------------------------------------------------------------------- loading

M = TypeVar("M", bound=BaseModel)


def format_validation_error(
    source: str, exc: ValidationError, loc_filter: Callable[[list[Any]], list[Any]] | None = None
) -> str:
    """One line per problem: ``source: key.path: reason``. ``loc_filter`` may tidy a path (e.g. drop the
    tag pydantic puts in the path of a discriminated union)."""
    problems = []
    for err in exc.errors():
        loc = list(err["loc"])
        if loc_filter is not None:
            loc = loc_filter(loc)
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        if not loc and err["type"] == "value_error":
            problems.append(f"{source}: {msg}")  # a model-level check names its own path
            continue
        path = ".".join(str(p) for p in loc) or "(top level)"
        problems.append(f"{source}: {path}: {msg}")
    return "\n".join(problems)


def parse_config(
    model: type[M], data: Any, source: str, loc_filter: Callable[[list[Any]], list[Any]] | None = None
) -> M:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc, loc_filter)) from None


def load_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{where}: invalid YAML: {problem}") from None


def load_config(model: type[M], path: Path | None) -> M:
    """Load ``path`` into ``model``; with no path, the embedded defaults."""
    if path is None:
        return model()
    return parse_config(model, load_yaml(path), str(path))
