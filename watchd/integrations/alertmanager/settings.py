"""The ``alertmanager:`` section of the engine config: where alerts go, how often they are sent again, how
the engine proves who it is to an Alertmanager behind authentication (basic auth or a bearer token, as
Alertmanager's ``--web.config.file`` or a reverse proxy asks), the TLS it speaks (a private CA, a client
certificate), and the labels every alert carries (``external_labels``: ``cluster`` above all, so that one
Alertmanager serving several clusters routes and groups by it). Secrets come from a file or the
environment, never the YAML itself (``password``/``token`` exist for tests)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from watchd.credentials import TokenSource, read_secret_file
from watchd.errors import ConfigError
from watchd.model.durations import Seconds
from watchd.strict import Strict

LabelName = Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")]


class BasicAuth(Strict):
    """HTTP basic authentication: ``username`` and exactly one of ``password_file``, ``password_env``,
    ``password``."""

    username: Annotated[str, Field(min_length=1, pattern=r"^[^:]+$")]
    password_file: Path | None = None
    password_env: str | None = None
    password: str | None = Field(default=None, repr=False)

    @model_validator(mode="after")
    def _exactly_one(self) -> BasicAuth:
        given = [n for n in ("password_file", "password_env", "password") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "basic_auth: give exactly one of password_file, password_env, password"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self

    def resolve(self, key: str) -> str:
        """The password (surrounding whitespace kept off a file's, as for tokens); ConfigError naming
        ``key`` when it cannot be had."""
        if self.password is not None:
            value = self.password
        elif self.password_env is not None:
            if self.password_env not in os.environ:
                raise ConfigError(f"{key}.password_env: environment variable {self.password_env} is not set")
            value = os.environ[self.password_env]
        else:
            assert self.password_file is not None
            value = read_secret_file(self.password_file, f"{key}.password_file").strip()
        if not value:
            raise ConfigError(f"{key}: the password is empty")
        return value


class AlertmanagerConfig(Strict):
    urls: list[Annotated[str, Field(pattern=r"^https?://")]] = Field(default_factory=list)
    resend_interval_s: Seconds = 60.0
    timeout_s: Seconds = 5.0
    # added to every alert watchd sends (an alert's own label of the same name wins, as in Prometheus)
    external_labels: dict[LabelName, Annotated[str, Field(min_length=1)]] = Field(default_factory=dict)
    basic_auth: BasicAuth | None = None
    bearer_token: TokenSource | None = None  # Authorization: Bearer <token>
    ca_file: Path | None = None  # https: trust this CA (default: the system's)
    client_cert: Path | None = None  # mutual TLS: the engine's certificate ...
    client_key: Path | None = None  # ... and its key

    @model_validator(mode="after")
    def _consistent(self) -> AlertmanagerConfig:
        if self.basic_auth is not None and self.bearer_token is not None:
            raise ValueError("alertmanager: give basic_auth or bearer_token, not both")
        if self.bearer_token is not None and not (
            self.bearer_token.token_file or self.bearer_token.token_env or self.bearer_token.token
        ):
            raise ValueError("alertmanager.bearer_token: give one of token_file, token_env, token")
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("alertmanager: give client_cert and client_key together")
        tls = self.ca_file is not None or self.client_cert is not None
        if tls and not any(u.startswith("https://") for u in self.urls):
            raise ValueError("alertmanager: ca_file/client_cert need https:// urls")
        return self
