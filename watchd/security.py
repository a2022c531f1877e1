"""Credentials and TLS from the daemons' config (docs/security.md): the engine's tokens by role, the TLS
contexts of a listener and of the agent's connection to the engine. Thin: the checks live in
:mod:`watchd.httputil` (who may do what) and :mod:`watchd.credentials` (what a secret file may be)."""

from __future__ import annotations

import ssl
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

from watchd.credentials import EngineAuth
from watchd.errors import ConfigError
from watchd.http_settings import Listen
from watchd.httputil import Credentials, client_tls, server_tls
from watchd.logs import get_logger

_log = get_logger("watchd.security")


def engine_credentials(auth: EngineAuth) -> Credentials:
    """The engine's tokens by role; warns about an engine that lets anyone read or act."""
    operators = {
        t.resolve(f"auth.operators[{i}] ({t.name})") or "": t.name for i, t in enumerate(auth.operators)
    }
    viewers = {t.resolve(f"auth.viewers[{i}] ({t.name})") or "": t.name for i, t in enumerate(auth.viewers)}
    if len(operators) + len(viewers) != len(auth.operators) + len(auth.viewers):
        raise ConfigError("auth: two operators or viewers share one token: give each its own")
    credentials = Credentials(
        shared=auth.resolve(),
        operators=operators,
        viewers=viewers,
        open_metrics=auth.open_metrics,
        open_health=auth.open_health,
    )
    if credentials.shared is not None and credentials.shared in {*operators, *viewers}:
        raise ConfigError("auth: the agents' token is also an operator's or viewer's: give each its own")
    if credentials.shared is None and (operators or viewers):
        # ingest is the agents' alone: without their token no agent could send events (and before, a
        # viewer's token ingested, and so drained)
        raise ConfigError(
            "auth: operators or viewers are set but not the agents' token (auth.token_file, token_env or "
            "token): agents ingest with their own token, never an operator's or a viewer's; set it"
        )
    if credentials.open:
        _log.warning(
            "engine_unauthenticated",
            hint="anyone who reaches the engine can ingest, read the audit and release held actions: "
            "set auth (docs/security.md)",
        )
    elif not operators and not viewers:
        _log.warning(
            "operators_unnamed",
            hint="the agents' token also operates and X-Watchd-Operator names whoever the caller says: "
            "configure auth.operators (docs/security.md)",
        )
    elif not operators:
        _log.warning(
            "operators_none",
            hint="viewers but no operators: nobody may release, discard or resume through the API "
            "(the agents' token only ingests): configure auth.operators (docs/security.md)",
        )
    return credentials


def listener_tls(listen: Listen, where: str) -> ssl.SSLContext | None:
    try:
        return server_tls(listen.tls_cert, listen.tls_key, listen.client_ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}.tls_cert/tls_key/client_ca: cannot load: {exc}") from None


def engine_client_tls(
    url: str, ca_file: Path | None, client_cert: Path | None, client_key: Path | None
) -> ssl.SSLContext | None:
    """The agent's TLS context for an https:// engine (its ``engine:`` section); None for http://."""
    if not url.startswith("https://"):
        return None
    try:
        return client_tls(ca_file, client_cert, client_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"engine.ca_file/client_cert/client_key: cannot load: {exc}") from None


def inline_secrets_metric(registry: CollectorRegistry, count: int) -> None:
    """``watchd_config_inline_secrets``: the secrets the daemon's config file holds inline while its group or
    others may read it (0: none); alert on it being above 0."""
    Gauge(
        "watchd_config_inline_secrets",
        "Secrets held inline in the config file while its group or others may read it (docs/security.md).",
        registry=registry,
    ).set(count)
