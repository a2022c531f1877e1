"""Daemon configuration: one YAML file per daemon, validated strictly at load.

Unknown keys and bad values are rejected with the file, the key path and the reason. Secrets (the ingest
token) come from the environment or a file, so the YAML itself can be world-readable.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, model_validator

from watchd.detect.params import DetectorsConfig
from watchd.errors import ConfigError
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
                value = self.token_file.read_text()
            except OSError as exc:
                raise ConfigError(f"auth.token_file: cannot read {self.token_file}: {exc.strerror}") from exc
        else:
            return None
        value = value.strip()
        if not value:
            raise ConfigError("auth: the token is empty")
        return value


class Listen(_Strict):
    host: str = "127.0.0.1"
    port: Port


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


class StateConfig(_Strict):
    path: Path | None = None  # None: in memory (not durable; the shipped config sets a file)
    audit_retention_days: Annotated[float, Field(gt=0)] = 90.0
    rules_snapshot_s: Seconds = 10.0  # how often what the rules remember is saved (and at shutdown)


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
    auth: TokenSource = TokenSource()
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
    log: LogConfig = LogConfig()
    reports: ReportsConfig = ReportsConfig()  # issue 18

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


class GpuSourceConfig(_Strict):
    backend: Literal["nvml", "dcgm", "fake", "none"] = "nvml"
    interval_s: Seconds = 2.0
    summary_window_s: Seconds = 5.0
    health_report_interval_s: Seconds = 30.0
    scenario: Path | None = None  # backend fake: a GPU scenario file (tests, demos, the simulator)
    dcgm_url: Annotated[str, Field(pattern=r"^https?://")] = "http://127.0.0.1:9400/metrics"
    xid_dedup_window_s: Seconds = 10.0
    proc_root: Path = Path("/proc")

    @model_validator(mode="after")
    def _scenario_for_fake(self) -> GpuSourceConfig:
        if self.backend == "fake" and self.scenario is None:
            raise ValueError("backend fake needs a scenario file")
        return self


class SourcesConfig(_Strict):
    kmsg: KmsgConfig = KmsgConfig()
    files: list[FileSourceConfig] = Field(default_factory=list)
    gpu: GpuSourceConfig = GpuSourceConfig()


class EngineEndpoint(_Strict):
    url: str = "http://127.0.0.1:9120"
    auth: TokenSource = TokenSource()
    timeout_s: Seconds = 5.0


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
    http_port: Port = 9123  # on 127.0.0.1 only; 0: off
    forward_interval_s: Seconds = 2.0
    max_ranks: Annotated[int, Field(ge=1)] = 1024
    forget_after_s: Seconds = 600.0
    http: HttpConfig = HttpConfig(max_connections=256)  # both endpoints (socket and 127.0.0.1)


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
