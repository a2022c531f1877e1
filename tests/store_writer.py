"""A child process for the kill -9 test of the state store: writes rows in a loop and, after each commit,
prints what it committed (``intent N``, ``finished N``, ``audit N``, ``disruption N``, ``held ID``).

Usage: python tests/store_writer.py DB_PATH
"""

from __future__ import annotations

import sys

from watchd.actions.audit import AuditRecord
from watchd.store.database import Store
from watchd.store.held import HeldAction


def say(*parts: object) -> None:
    print(*parts, flush=True)


def main(path: str) -> None:
    with Store.open(path) as store:
        say("ready")
        for i in range(1_000_000):  # the parent kills it long before the end
            key = f"drain:n{i}"
            store.intents.begin(key, "drain", f"n{i}", "xid-79", f"e{i}", {"reason": "xid 79"}, float(i))
            say("intent", i)
            if i % 2 == 0:
                store.intents.finish(key, "drained", "ok", float(i) + 0.5)
                say("finished", i)
            store.audit.append(
                AuditRecord(float(i), "xid-79", f"e{i}", f"n{i}", "drain", "enforce", "drained")
            )
            say("audit", i)
            store.breaker.record("gpu", f"n{i}", float(i))
            say("disruption", i)
            held_id = store.held.hold(
                HeldAction("xid-79", "drain", f"n{i}", "gpu", {}, {"id": f"e{i}"}, "breaker open", float(i))
            )
            say("held", held_id)


if __name__ == "__main__":
    main(sys.argv[1])
