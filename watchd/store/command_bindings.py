"""Which run of a node's agent each command was first handed to (its *instance*), recorded before the
command is handed out: a later run of that agent (restarted, its memory of the command lost) is then told so
and refuses it, and so is every engine that reads the same store (a restart, a PostgreSQL failover). The
binding of a command is never changed once written.

Bounded: a row is marked finished when its action stops waiting for the command; finished rows are pruned
after the audit's retention, unfinished ones (an engine that died while its action waited) after
:data:`UNFINISHED_KEPT_S`."""

from __future__ import annotations

from dataclasses import dataclass

from watchd.store.connection import Connection

#: an unfinished binding is kept this long: far past any action's wait (minutes) and its re-drives
UNFINISHED_KEPT_S = 30 * 86400.0


@dataclass(frozen=True, slots=True)
class Binding:
    command_id: str
    node: str
    instance: str
    bound_at: float


class CommandBindings:
    def __init__(self, db: Connection) -> None:
        self._db = db

    def bind(self, command_id: str, node: str, instance: str, at: float) -> Binding:
        """Bind ``command_id`` to ``instance`` unless it is bound already; the binding either way (one
        transaction: two engines binding at once get the same one)."""
        with self._db.write(f"binding the command {command_id} to an agent") as conn:
            conn.execute(
                "INSERT INTO command_bindings (command_id, node, instance, bound_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (command_id) DO NOTHING",
                (command_id, node, instance, at),
            )
            row = conn.execute(
                "SELECT node, instance, bound_at FROM command_bindings WHERE command_id = ?", (command_id,)
            ).fetchone()
        return Binding(command_id, str(row[0]), str(row[1]), float(row[2]))

    def get(self, command_id: str) -> Binding | None:
        row = self._db.one(
            "reading a command's binding",
            "SELECT node, instance, bound_at FROM command_bindings WHERE command_id = ?",
            (command_id,),
        )
        return None if row is None else Binding(command_id, str(row[0]), str(row[1]), float(row[2]))

    def finish(self, command_id: str, at: float) -> None:
        """The action no longer waits for ``command_id``: its row may be pruned after the retention."""
        with self._db.write(f"finishing the binding of {command_id}") as conn:
            conn.execute(
                "UPDATE command_bindings SET finished_at = ? WHERE command_id = ? AND finished_at IS NULL",
                (at, command_id),
            )

    def prune(self, finished_before: float, now: float) -> int:
        return self._db.delete(
            "pruning the command bindings",
            "DELETE FROM command_bindings WHERE finished_at < ? OR (finished_at IS NULL AND bound_at < ?)",
            (finished_before, now - UNFINISHED_KEPT_S),
        )
