"""Opening the engine's state database as ``state`` configures it: SQLite at ``state.path`` (in memory, with
a warning, when none is given), or PostgreSQL for engines that share it."""

from __future__ import annotations

from watchd.errors import ConfigError
from watchd.logs import get_logger
from watchd.store.database import Store
from watchd.store.settings import StateConfig

__all__ = ["BUSY_TIMEOUT_S", "open_state"]

_log = get_logger("watchd.engine")

#: The engine writes the state database on its event loop: a write waits this long for another process's
#: lock, then fails (the batch is answered 503 and the agent re-sends it), so that a lock held by someone
#: else never stalls ingest, /healthz and the detectors for the whole default busy timeout.
BUSY_TIMEOUT_S = 0.1


def open_state(state: StateConfig) -> Store:
    if state.kind == "postgres":  # shared by the engines of an HA pair
        pg = state.postgres
        dsn, password = pg.resolve()
        return Store.open_postgres(
            dsn,
            password,
            lock_timeout_s=pg.lock_timeout_s,
            statement_timeout_s=pg.statement_timeout_s,
            connect_timeout_s=pg.connect_timeout_s,
        )
    path = state.path
    if path is None:
        _log.warning(
            "state_not_durable",
            hint="set state.path: decisions, cooldowns and the breaker are lost on restart",
        )
        return Store.open(":memory:")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"state.path: cannot create {path.parent}: {exc.strerror}") from None
    return Store.open(path, busy_timeout_s=BUSY_TIMEOUT_S)
