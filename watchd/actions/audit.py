"""The audit trail: every decision the engine takes, with its outcome and timing."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from watchd.logs import get_logger
from watchd.model.events import Scalar


@dataclass(frozen=True, slots=True)
class AuditRecord:
    time: float
    rule: str
    event_id: str
    node: str
    action: str
    mode: str
    outcome: str
    detail: str = ""
    duration_s: float = 0.0
    params: dict[str, Scalar] = field(default_factory=dict)
    #: what the action left, as data (requeued job ids, the spare released, a validation's verdicts)
    result: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: that deep-copies, and this runs for every action.
        return {name: getattr(self, name) for name in _FIELDS}


_FIELDS = tuple(f.name for f in fields(AuditRecord))


class AuditSink(Protocol):
    def record(self, entry: AuditRecord) -> None: ...


class MemoryAudit:
    """Keeps the most recent records for the status API and writes each one to the structured log."""

    def __init__(self, keep: int = 10_000) -> None:
        self.entries: deque[AuditRecord] = deque(maxlen=keep)
        self._log = get_logger("watchd.audit")

    def record(self, entry: AuditRecord) -> None:
        self.entries.append(entry)
        self._log.info("action", **entry.to_dict())

    def recent(self, limit: int = 100) -> list[AuditRecord]:
        return list(self.entries)[-limit:]
