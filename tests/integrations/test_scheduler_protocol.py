"""Every scheduler implements every verb of the Scheduler protocol, the fenced wrapper included: a verb added
to the protocol and forgotten in one scheduler fails here, not at a site (the registry builds Slurm and
Kubernetes by name, which mypy cannot follow)."""

from __future__ import annotations

import importlib
import inspect

import pytest

from watchd.integrations.base import SCHEDULER_VERBS, Scheduler
from watchd.integrations.registry import SCHEDULERS
from watchd.integrations.routing.scheduler import RoutedScheduler
from watchd.port import gated_class

VERBS = sorted(
    name for name, member in vars(Scheduler).items() if inspect.iscoroutinefunction(member) and name[0] != "_"
)


def _built_class(target: str) -> type:
    module, _, function = target.partition(":")
    returned = inspect.signature(getattr(importlib.import_module(module), function)).return_annotation
    cls = getattr(importlib.import_module(module), returned) if isinstance(returned, str) else returned
    assert isinstance(cls, type), target
    return cls


CLASSES = {name: _built_class(target) for name, target in SCHEDULERS.items()}
CLASSES |= {"routing": RoutedScheduler, "fenced": gated_class(SCHEDULER_VERBS)}


def test_the_protocol_has_verbs() -> None:
    assert {"drain", "requeue_jobs_on", "resume", "node_states", "pools"} <= set(VERBS)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_scheduler_has_every_verb(name: str) -> None:
    cls = CLASSES[name]
    missing = [v for v in VERBS if not inspect.iscoroutinefunction(getattr(cls, v, None))]
    assert missing == [], f"{cls.__name__} lacks {', '.join(missing)}"
