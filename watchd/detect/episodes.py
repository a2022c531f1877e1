"""What the correlator remembers between cycles: one episode per condition of a job, and what it reported.

An :class:`~watchd.detect.detector.Onset` is reported when its episode begins and again only when its culprit
becomes better known (a culprit where there was none, hardware where there was not: ``revision`` counts); a
:class:`~watchd.detect.detector.Persisting` once it held its ``for_s`` and then every ``every_s``. A condition
not seen for ``clear_after_s`` ends its episode; a later one is a new episode.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from watchd.detect.detector import Onset, Persisting, Sighting
from watchd.detect.finding import Finding


@dataclass(slots=True)
class _Episode:
    onset: float
    last_true: float
    last_report: float  # 0: not reported yet
    revision: int = 0
    strength: int = 0


def strength(f: Finding) -> int:
    return 2 if f.hardware else 1 if f.culprit_node is not None else 0


class Episodes:
    def __init__(self, clear_after_s: float) -> None:
        self.clear_after_s = clear_after_s
        self._episodes: dict[tuple[str, ...], _Episode] = {}

    def __len__(self) -> int:
        return len(self._episodes)

    def sighted(self, job: str, sighting: Sighting, now: float) -> Finding | None:
        """``sighting`` holds in ``job`` at ``now``: the finding to report, if one is due."""
        key = (job, *sighting.key)
        if isinstance(sighting, Onset):
            return self._onset(key, sighting.finding, now)
        return self._persisting(key, sighting, now)

    def _onset(self, key: tuple[str, ...], finding: Finding, now: float) -> Finding | None:
        ep = self._episodes.get(key)
        if ep is None:
            self._episodes[key] = _Episode(finding.onset, now, now, 0, strength(finding))
            return finding
        ep.last_true = now
        if strength(finding) <= ep.strength:
            return None
        ep.revision += 1
        ep.strength = strength(finding)
        ep.last_report = now
        return replace(finding, revision=ep.revision)

    def _persisting(self, key: tuple[str, ...], s: Persisting, now: float) -> Finding | None:
        ep = self._episodes.get(key)
        if ep is None:
            self._episodes[key] = _Episode(now, now, 0.0)
            return None
        ep.last_true = now
        if now - ep.onset < s.for_s or (ep.last_report and now - ep.last_report < s.every_s):
            return None
        revision = ep.revision if not ep.last_report else ep.revision + 1
        finding = s.finding(ep.onset, revision)
        if finding is not None:
            ep.last_report = now
            ep.revision = revision
        return finding

    def expire(self, now: float) -> None:
        """End the episodes whose condition was not seen for ``clear_after_s`` (those seen at ``now`` stay:
        ``clear_after_s`` is positive)."""
        clear = self.clear_after_s
        for key in [k for k, ep in self._episodes.items() if now - ep.last_true >= clear]:
            del self._episodes[key]
