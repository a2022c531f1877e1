"""Daemon configuration: one YAML file per daemon, validated strictly at load.

Unknown keys (with the closest known one), bad values and keys given twice are rejected with the file, the
line and column, the key path and the reason. Secrets (the ingest token) come from the environment or a
file, so the YAML itself can be world-readable.

This module composes :class:`EngineConfig` and :class:`AgentConfig` from the sections their owners define
(each package's ``settings.py`` or ``params.py``, importing only pydantic and watchd's vocabulary, so that
loading a config never imports an integration: ``tests/architecture/test_config_imports.py``) and loads them.
Every section is re-exported here under its old name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from watchd.actions.settings import ActionsConfig, RemediationConfig, SafetyConfig
from watchd.agent.settings import AgentConfig, EngineEndpoint, HeartbeatConfig, ShipperConfig
from watchd.checks.params import ChecksConfig
from watchd.credentials import EngineAuth, NamedToken, TokenSource, check_secret_file
from watchd.detect.params import DetectorsConfig
from watchd.errors import ConfigError
from watchd.fleetview.settings import DrainsConfig, SparesConfig
from watchd.gpu.settings import GpuSourceConfig
from watchd.http_settings import HttpConfig, Listen, Port
from watchd.integrations.alertmanager.settings import AlertmanagerConfig
from watchd.integrations.fake.settings import FakeSchedulerConfig
from watchd.integrations.kubernetes.settings import EvictionConfig, KubernetesConfig, LeaderElectionConfig
from watchd.integrations.settings import SchedulerRoute, SchedulerSettings
from watchd.integrations.slurm.settings import SlurmConfig
from watchd.jobs.settings import JobsConfig
from watchd.logs import LogConfig
from watchd.model.durations import Seconds
from watchd.reliability.settings import ReliabilityConfig
from watchd.reports.settings import ReportsConfig
from watchd.sources.settings import (
    FileSourceConfig,
    JournaldConfig,
    KmsgConfig,
    SourcesConfig,
    TrainingLogsConfig,
)
from watchd.store.settings import DatabaseLeaseConfig, PostgresConfig, StateConfig
from watchd.strict import Strict as _Strict
from watchd.yamlfile import DuplicateKeyError, YamlPositions, keys_at, safe_load, suggestion

__all__ = [
    "ActionsConfig",
    "AgentConfig",
    "AlertmanagerConfig",
    "ChecksConfig",
    "DatabaseLeaseConfig",
    "DetectorsConfig",
    "DrainsConfig",
    "EngineAuth",
    "EngineConfig",
    "EngineEndpoint",
    "EvictionConfig",
    "FakeSchedulerConfig",
    "FileSourceConfig",
    "GpuSourceConfig",
    "HeartbeatConfig",
    "HttpConfig",
    "IngestConfig",
    "JobsConfig",
    "JournaldConfig",
    "KmsgConfig",
    "KubernetesConfig",
    "LeaderElectionConfig",
    "Listen",
    "LogConfig",
    "NamedToken",
    "Port",
    "PostgresConfig",
    "ReliabilityConfig",
    "ReloadConfig",
    "RemediationConfig",
    "ReportsConfig",
    "SafetyConfig",
    "SchedulerRoute",
    "SchedulerSettings",
    "Seconds",
    "ShipperConfig",
    "SlurmConfig",
    "SourcesConfig",
    "SparesConfig",
    "StateConfig",
    "TokenSource",
    "TrainingLogsConfig",
    "check_secret_file",
    "format_validation_error",
    "load_config",
    "load_yaml",
    "parse_config",
    "scheduler_names",
]

# ---------------------------------------------------------------------------------------------- engine


# the engine shell's own sections
class IngestConfig(_Strict):
    max_body_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    max_events_per_batch: Annotated[int, Field(ge=1)] = 10_000
    dedup_window_s: Seconds = 3600.0
    dedup_max_ids: Annotated[int, Field(ge=1000)] = 1_000_000
    queue_size: Annotated[int, Field(ge=1)] = 100_000
    # a reply waits at most this long for its batch to be evaluated: below the agents' engine.timeout_s (5 s),
    # so that behind a backlog the agent gets its answer instead of giving up and sending the batch again
    ack_timeout_s: Seconds = 2.5


class ReloadConfig(_Strict):
    watch_files: bool = True
    poll_interval_s: Seconds = 2.0


class EngineConfig(_Strict):
    listen: Listen = Listen(port=9120)
    http: HttpConfig = HttpConfig()
    external_url: str = ""
    auth: EngineAuth = EngineAuth()
    mode: Literal["dry-run", "enforce"] = "dry-run"
    rules: list[Path] = Field(default_factory=list)
    default_rules: bool = True  # false: only the rules of `rules`, none of the embedded pack
    reload: ReloadConfig = ReloadConfig()
    ingest: IngestConfig = IngestConfig()
    slurm: SlurmConfig = SlurmConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    fake: FakeSchedulerConfig = FakeSchedulerConfig()
    schedulers: list[SchedulerRoute] = Field(default_factory=list)
    actions: ActionsConfig = ActionsConfig()
    safety: SafetyConfig = SafetyConfig()
    remediation: RemediationConfig = RemediationConfig()
    state: StateConfig = StateConfig()
    alertmanager: AlertmanagerConfig = AlertmanagerConfig()
    jobs: JobsConfig = JobsConfig()
    detectors: DetectorsConfig = DetectorsConfig()
    checks: ChecksConfig = ChecksConfig()  # active checks (docs/checks.md)
    reliability: ReliabilityConfig = ReliabilityConfig()
    drains: DrainsConfig = DrainsConfig()
    spares: SparesConfig = SparesConfig()
    log: LogConfig = LogConfig()
    reports: ReportsConfig = ReportsConfig()

    @model_validator(mode="after")
    def _one_election(self) -> EngineConfig:  # the database lease fences the shared store
        if self.state.kind == "postgres" and self.kubernetes.leader_election.enabled:
            raise ValueError(
                "kubernetes.leader_election: with state.kind postgres the engines elect through the database "
                "lease (state.postgres.leader_election), whose token fences the store's writes"
            )
        return self

    @model_validator(mode="after")
    def _some_rules(self) -> EngineConfig:
        if not self.default_rules and not self.rules:
            raise ValueError("default_rules: false needs rule files in rules: (else the engine has no rules)")
        return self

    @field_validator("auth", mode="before")
    @classmethod
    def _shared_token_only(cls, value: Any) -> Any:
        # a plain TokenSource (the shared token alone) is an EngineAuth with no roles
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


# ----------------------------------------------------------------------------------------------- loading

M = TypeVar("M", bound=BaseModel)


def format_validation_error(
    source: str,
    exc: ValidationError,
    loc_filter: Callable[[list[Any]], list[Any]] | None = None,
    positions: YamlPositions | None = None,
    model: type[BaseModel] | None = None,
) -> str:
    """One line per problem: ``source:line:column: key.path: reason`` (``source: key.path: reason`` without
    ``positions``), an unknown key with the known key closest to it. ``loc_filter`` may tidy a path (e.g.
    drop the tag pydantic puts in the path of a discriminated union); ``model``: the model validated, whose
    keys the suggestions come from."""
    problems: list[tuple[tuple[int, int], str]] = []
    for err in exc.errors():
        raw = list(err["loc"])
        loc = loc_filter(raw) if loc_filter is not None else raw
        unknown = err["type"] == "extra_forbidden"
        msg = "unknown key" if unknown else err["msg"].removeprefix("Value error, ")
        if unknown and model is not None and raw:
            msg += suggestion(str(raw[-1]), keys_at(model, raw[:-1]))
        if not loc and err["type"] == "value_error":
            problems.append(((0, 0), f"{source}: {msg}"))  # a model-level check names its own path
            continue
        where, at = source, (0, 0)
        if positions is not None:
            at = positions.of(tuple(loc), key=unknown)
            where = f"{source}:{at[0]}:{at[1]}"
        path = ".".join(str(p) for p in loc) or "(top level)"
        problems.append((at, f"{where}: {path}: {msg}"))
    return "\n".join(text for _, text in sorted(problems, key=lambda p: p[0]))  # in the file's order


def parse_config(
    model: type[M],
    data: Any,
    source: str,
    loc_filter: Callable[[list[Any]], list[Any]] | None = None,
    positions: YamlPositions | None = None,
) -> M:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc, loc_filter, positions, model)) from None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def _parse_yaml(text: str, source: str) -> Any:
    try:
        return safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        kind = "" if isinstance(exc, DuplicateKeyError) else "invalid YAML: "
        raise ConfigError(f"{source}{where}: {kind}{problem}") from None


def load_yaml(path: Path) -> Any:
    """The YAML document in ``path``; a ConfigError with file:line:column for invalid YAML or a key given
    twice in one mapping."""
    return _parse_yaml(_read(path), str(path))


def load_config(model: type[M], path: Path | None) -> M:
    """Load ``path`` into ``model``; with no path, the embedded defaults."""
    if path is None:
        return model()
    text = _read(path)
    return parse_config(model, _parse_yaml(text, str(path)), str(path), positions=YamlPositions(text))
