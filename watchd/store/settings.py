"""The state database's config section (``state:``): SQLite, or PostgreSQL shared by engines (HA)
with its database lease. Pydantic and watchd's vocabulary only: psycopg is not imported to load a config."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from watchd.credentials import read_secret_file
from watchd.errors import ConfigError
from watchd.model.durations import Seconds
from watchd.strict import Strict


class DatabaseLeaseConfig(Strict):
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
        value = read_secret_file(file, f"{key}_file")  # checked as every secret file (docs/security.md)
    else:
        return None
    value = value.strip()
    if not value:
        raise ConfigError(f"{key}: empty")
    return value


class PostgresConfig(Strict):
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


class StateConfig(Strict):
    kind: Literal["sqlite", "postgres"] = "sqlite"  # postgres: shared by engines (HA)
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
