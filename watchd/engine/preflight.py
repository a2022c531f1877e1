"""What the engine checks of its config before it opens anything: the one function behind both
``watchd engine --check`` and :meth:`Engine.start <watchd.engine.runner.Engine.start>`, so that a config the
check accepts is one the engine starts with.

Everything that can be known without changing anything: the tokens by role and their cross-checks, the
listener's TLS files, the rules, the state database's settings (its secrets; a SQLite folder that can be
created), the Alertmanager credentials and TLS files, the Kubernetes credentials where something needs
them, and the check jobs' output folder. A problem is a ConfigError naming the key."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from watchd.config import EngineConfig
from watchd.errors import ConfigError
from watchd.httputil import Credentials
from watchd.security import engine_credentials, listener_tls
from watchd.store.settings import StateConfig

__all__ = ["Checked", "preflight"]


@dataclass(frozen=True, slots=True)
class Checked:
    token: str | None  # the agents' token
    credentials: Credentials
    tls: ssl.SSLContext | None  # the listener's
    notes: tuple[str, ...] = ()  # what --check prints besides "ok"


def preflight(config: EngineConfig) -> Checked:
    """Every check of the start that changes nothing; a ConfigError naming the key for the first problem."""
    token = config.auth.resolve()
    credentials = engine_credentials(config.auth)
    tls = listener_tls(config.listen, "listen")
    check_state(config.state)
    if config.alertmanager.urls:
        from watchd.integrations.alertmanager.notifier import alertmanager_tls, auth_headers

        auth_headers(config.alertmanager)
        alertmanager_tls(config.alertmanager)
    _kubernetes(config)
    return Checked(token, credentials, tls, _checks(config))


def check_state(state: StateConfig) -> None:
    """PostgreSQL: its connection string and password can be read. SQLite: the database's folder exists or
    can be created (nothing is created here)."""
    if state.kind == "postgres":
        state.postgres.resolve()
        return
    if state.path is None:
        return
    folder = state.path.parent
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("/"))
    if not existing.is_dir():
        raise ConfigError(f"state.path: cannot create {folder}: {existing} is not a folder")
    if existing != folder and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"state.path: cannot create {folder}: {existing} is not writable")


def _kubernetes(config: EngineConfig) -> None:
    k = config.kubernetes
    checks = config.checks
    if k.enabled or k.leader_election.enabled or (checks.enabled and checks.runner == "kubernetes"):
        from watchd.integrations.kubernetes.client import kube_config

        kube_config(k.kubeconfig, k.context, in_cluster=k.in_cluster)


def _checks(config: EngineConfig) -> tuple[str, ...]:
    checks = config.checks
    if not (checks.enabled and checks.runner == "slurm"):
        return ()
    from watchd.integrations.slurm.output_dir import check_output_dir, engine_uid

    uid = engine_uid(checks.slurm.user)
    found = check_output_dir(checks.output_dir, create=False, uid=uid)  # ConfigError: unsafe
    return (f"checks.output_dir: {checks.output_dir}: {found}",)
