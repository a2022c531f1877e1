"""What the rules remember (count windows, ``for`` holds, ``unless`` sightings, rule cooldowns): one JSON
document per rule, saved as a whole snapshot every few seconds and at shutdown."""

from __future__ import annotations

from collections.abc import Mapping

from watchd.store.connection import Connection


class RuleStates:
    def __init__(self, db: Connection) -> None:
        self._db = db

    def save(self, states: Mapping[str, tuple[str, str]], saved_at: float) -> None:
        """Replace the saved rule state with ``states`` (rule -> (fingerprint, JSON)), in one transaction:
        a crash leaves the previous snapshot or this one, never a mix."""
        rows = [(rule, fp, text, saved_at) for rule, (fp, text) in states.items()]
        with self._db.write("saving the rule state") as conn:
            conn.execute("DELETE FROM rule_state")
            conn.executemany(
                "INSERT INTO rule_state (rule, fingerprint, state, saved_at) VALUES (?, ?, ?, ?)", rows
            )

    def load(self) -> dict[str, tuple[str, str]]:
        """The saved rule state: rule -> (fingerprint, JSON)."""
        rows = self._db.all("reading the rule state", "SELECT rule, fingerprint, state FROM rule_state")
        return {str(r[0]): (str(r[1]), str(r[2])) for r in rows}
