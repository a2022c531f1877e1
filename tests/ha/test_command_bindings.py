"""The agents' command bindings in the state database, on both backends: a command is bound to the first agent
instance that fetched it before it is handed out, and every engine on the same store (a restart on the SQLite
file, a failover on PostgreSQL) hands it out with that binding, never another; finished bindings are pruned
after the retention, unfinished ones far later; and a binding that cannot be written hands nothing out."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.harness.postgres import PostgresServer
from watchd.actions.agent_commands import AgentCommands, CallRefused
from watchd.clock import FakeClock
from watchd.model.commands import Command, CommandResult
from watchd.store.command_bindings import UNFINISHED_KEPT_S
from watchd.store.database import Store

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.real)]
COMMAND = Command("gpu-reset-7", "gpu-1", "gpu_reset", {"gpu": "0000:3b:00.0"}, issued_at=1000.0)


@pytest.fixture(params=BACKENDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens the same database again each call: a second engine on the store (or the first, restarted)."""
    opened: list[Store] = []
    if request.param == "sqlite":

        def open_sqlite() -> Store:
            opened.append(Store.open(tmp_path / "state.db"))
            return opened[-1]

        yield open_sqlite
    else:
        pg: PostgresServer = request.getfixturevalue("pg_server")
        dsn = pg.dsn(pg.create_database())

        def open_pg() -> Store:
            opened.append(Store.open_postgres(dsn, pg.password))
            return opened[-1]

        yield open_pg
    for store in opened:
        store.close()


async def test_every_engine_on_the_store_hands_a_command_out_bound_to_its_first_fetcher(
    opener: Callable[[], Store],
) -> None:
    first = AgentCommands(FakeClock(), bindings=opener().command_bindings)
    waiting = asyncio.ensure_future(first.run(COMMAND, 5))
    await asyncio.sleep(0)
    assert [c.bound_to for c in first.fetch("gpu-1", "run-a")] == ["run-a"]
    waiting.cancel()  # the engine dies (kill -9 or a lost lead): its action is driven again elsewhere
    await asyncio.gather(waiting, return_exceptions=True)

    second = AgentCommands(FakeClock(), bindings=opener().command_bindings)
    again = asyncio.ensure_future(second.run(COMMAND, 5))
    await asyncio.sleep(0)
    assert [c.bound_to for c in second.fetch("gpu-1", "run-b")] == ["run-a"], "never bound again"
    assert second.report("gpu-1", "run-b", CommandResult(COMMAND.id, "done"))[0] == 409
    assert second.report("gpu-1", "run-a", CommandResult(COMMAND.id, "done"))[0] == 200
    assert (await again).outcome == "done"


def test_bindings_are_kept_until_finished_and_past_the_retention(opener: Callable[[], Store]) -> None:
    bindings = opener().command_bindings
    assert bindings.bind("c-1", "gpu-1", "run-a", 100.0).instance == "run-a"
    assert bindings.bind("c-1", "gpu-1", "run-b", 200.0).instance == "run-a"
    bindings.bind("c-2", "gpu-1", "run-a", 100.0)
    bindings.finish("c-1", 300.0)
    assert bindings.prune(finished_before=300.0, now=400.0) == 0
    assert bindings.prune(finished_before=301.0, now=400.0) == 1
    assert bindings.get("c-1") is None and bindings.get("c-2") is not None, "unfinished: kept"
    assert bindings.prune(finished_before=0.0, now=100.0 + UNFINISHED_KEPT_S + 1) == 1
    assert bindings.get("c-2") is None


async def test_a_binding_that_cannot_be_written_hands_nothing_out(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    store = Store.open(tmp_path / "state.db")
    queue = AgentCommands(FakeClock(), registry, bindings=store.command_bindings)
    waiting = asyncio.ensure_future(queue.run(COMMAND, 5))
    await asyncio.sleep(0)
    store.close()  # every write now fails
    with pytest.raises(CallRefused) as refused:
        queue.fetch("gpu-1", "run-a")
    assert refused.value.status == 503
    labels = {"call": "fetch", "reason": "not_bound"}
    assert registry.get_sample_value("watchd_agent_command_calls_refused_total", labels) == 1
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
