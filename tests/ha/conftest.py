"""A real PostgreSQL (tests/harness/postgres.py), started once per session when a test asks (issue 22)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.postgres import PostgresServer, available
from tests.support import real_components_required


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL cluster on loopback. Skips when PostgreSQL is not installed, except under CI /
    WATCHD_REQUIRE_SLURM=1 where it fails."""
    ok, why = available()
    if not ok:
        if real_components_required():
            pytest.fail(f"PostgreSQL required (CI / WATCHD_REQUIRE_SLURM=1) but unavailable: {why}")
        pytest.skip(why)
    with PostgresServer() as server:  # raises with the server's log on failure: never a skip
        yield server


@pytest.fixture
def pg_db(pg_server: PostgresServer) -> str:
    """A fresh database of the server; its connection string (the password is the server's)."""
    return pg_server.dsn(pg_server.create_database())
