"""Every audit record goes to the durable trail (the status API and the CLI read it after a restart) and to
the in-memory one (the log line, the tests)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from watchd.actions.audit import AuditRecord, AuditSink
from watchd.store.connection import StoreError
from watchd.store.database import Store


class AuditTrail:
    def __init__(self, sink: AuditSink, store: Store) -> None:
        self._sink = sink
        self._store = store
        #: an audit record could not be written since this was last cleared: the finished actions without
        #: theirs are to be audited once the store takes writes again (Recovery.catch_up)
        self.missed = False

    def record(self, entry: AuditRecord) -> None:
        self._sink.record(entry)
        try:
            self._store.audit.append(entry)
        except StoreError:
            self.missed = True
            raise


def scalars(params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters as they go to the audit log and the store: JSON values."""
    return json.loads(json.dumps(dict(params), default=str))  # type: ignore[no-any-return]
