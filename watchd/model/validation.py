"""What a validation of a drained node came to (``watchd node validate``, the ``validate`` action): shared by
the action that runs it and the checks that carry it out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Validation"]


@dataclass(frozen=True, slots=True)
class Validation:
    #: what became of the node: back in service, drained again (with the new evidence), left as it was
    #: (refused: not one to validate now; failed: nothing was begun), or left mid-way (interrupted: the last
    #: step could not be made; it must be finished by whoever leads), or drained again with a link not checked
    #: (not_checked: no known-good partner for a pair check; tried again when one frees up)
    done: Literal["resumed", "drained", "refused", "failed", "interrupted", "not_checked"]
    passed: bool
    detail: str
    #: one entry per check run: node, check, outcome, passed, evidence, job, figures
    results: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
