"""Where the daemons' secrets come from (docs/security.md): the shared bearer token (:class:`TokenSource`),
a person's named token, the engine's credentials by role (``auth:``), and what a secret file may be. Secrets
come from the environment or a file, so the YAML itself can be world-readable."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from watchd.errors import ConfigError
from watchd.logs import get_logger
from watchd.strict import Strict


class TokenSource(Strict):
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
            path = systemd_credential(self.token_file)
            try:
                check_secret_file(path, "token_file")
                value = path.read_text()
            except OSError as exc:
                raise ConfigError(f"auth.token_file: cannot read {path}: {exc.strerror}") from exc
        else:
            return None
        value = value.strip()
        if not value:
            raise ConfigError("auth: the token is empty")
        return value


def systemd_credential(path: Path) -> Path:
    """Where to read the secret file ``path``: systemd's copy when the service was given one by
    ``LoadCredential=NAME:PATH`` with NAME the file's name (``$CREDENTIALS_DIRECTORY/NAME``), else ``path``.
    So the file itself can stay readable by root only while the service runs as its own user, and the
    same config works outside the unit (``watchd engine --check`` as root)."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if directory:
        credential = Path(directory) / path.name
        if credential.is_file():
            return credential
    return path


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
        get_logger("watchd.config").warning(  # the logger the config loading has always named
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
    ``viewers``: named tokens that may read ``/api/v1/*``. Only the shared token ingests: operators or
    viewers without it are refused at start. With neither, the shared token does both (the name recorded
    is ``X-Watchd-Operator``, marked unverified). With no credential at all, everything is open (``make
    demo``): the engine logs a warning at start."""

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
