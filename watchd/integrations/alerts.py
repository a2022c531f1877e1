"""The alerting interface the action executor talks to: one real (Alertmanager) and one fake implementation.

An alert is identified, on watchd's side, by a caller-chosen *key* (e.g. ``"xid79/gpu-1"``): ``fire`` starts
or refreshes the alert under that key, ``resolve`` ends it. Alertmanager identifies alerts by their label set
(the fingerprint), so two keys must not carry the same labels.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

# Alertmanager (Prometheus data model) label and annotation names; anything else is refused with a 400.
_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert as Alertmanager sees it. ``labels`` identify it (and must include ``alertname``);
    ``annotations`` carry the text (``summary``, ``description``, ``runbook_url``...).

    Label and annotation names must be valid Prometheus names (``[a-zA-Z_][a-zA-Z0-9_]*``): a bad name is a
    programming error and raises ``ValueError`` here rather than a rejected delivery later. Labels with an
    empty value are dropped, as Alertmanager would drop them."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    generator_url: str = ""

    def __post_init__(self) -> None:
        if not self.labels.get("alertname"):
            raise ValueError(f"an alert needs a non-empty 'alertname' label: {dict(self.labels)!r}")
        for kind, names in (("label", self.labels), ("annotation", self.annotations)):
            bad = [n for n in names if not _NAME.match(n)]
            if bad:
                raise ValueError(f"invalid {kind} name(s) {bad!r}: must match [a-zA-Z_][a-zA-Z0-9_]*")
        # own copies: the caller may mutate its dicts later
        object.__setattr__(self, "labels", {k: str(v) for k, v in self.labels.items() if v != ""})
        object.__setattr__(self, "annotations", {k: str(v) for k, v in self.annotations.items()})

    @property
    def name(self) -> str:
        return self.labels["alertname"]


class AlertSink(Protocol):
    """Where alerts go. Neither method raises for a delivery failure: alerting must never block an action."""

    async def fire(self, key: str, alert: Alert) -> None:
        """Start, or refresh, the firing alert ``key``. Idempotent per key: firing it again keeps its start
        time (an alert whose labels changed replaces the old one, which is resolved)."""
        ...

    async def resolve(self, key: str) -> None:
        """End the alert ``key``. Idempotent: an unknown (or already resolved) key is a no-op."""
        ...


CallKind = Literal["fire", "resolve"]


@dataclass(slots=True)
class FakeAlertSink:
    """An in-memory :class:`AlertSink` for unit tests.

    ``firing`` holds the alerts firing now (key -> alert), ``resolved`` the alerts resolved (key -> the last
    alert fired under that key, dropped again when the key fires anew), ``calls`` every call in order:
    ``("fire", key, alert)`` or ``("resolve", key, alert-or-None)``."""

    firing: dict[str, Alert] = field(default_factory=dict)
    resolved: dict[str, Alert] = field(default_factory=dict)
    calls: list[tuple[CallKind, str, Alert | None]] = field(default_factory=list)

    async def fire(self, key: str, alert: Alert) -> None:
        self.calls.append(("fire", key, alert))
        self.firing[key] = alert
        self.resolved.pop(key, None)

    async def resolve(self, key: str) -> None:
        alert = self.firing.pop(key, None)
        self.calls.append(("resolve", key, alert))
        if alert is not None:
            self.resolved[key] = alert

    def names(self) -> list[str]:
        """The ``alertname`` of each firing alert, sorted (handy in assertions)."""
        return sorted(a.name for a in self.firing.values())
