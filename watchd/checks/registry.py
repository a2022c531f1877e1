"""Check runners built by name (``checks.runner``), imported only when chosen."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, cast

from watchd.checks.runner import CheckRunner
from watchd.errors import ConfigError

__all__ = ["RUNNERS", "build_runner"]

#: runner name -> "module:function" building it from the engine config
RUNNERS: Mapping[str, str] = {
    "slurm": "watchd.integrations.slurm.checks:runner_from_config",
    "kubernetes": "watchd.integrations.kubernetes.checks:runner_from_config",
    "fake": "watchd.integrations.fake.checks:runner_from_config",
}


def build_runner(name: str, config: Any) -> CheckRunner:
    target = RUNNERS.get(name)
    if target is None:
        raise ConfigError(f"checks.runner: unknown runner {name!r} (known: {', '.join(sorted(RUNNERS))})")
    module, _, function = target.partition(":")
    build = cast(Callable[[Any], CheckRunner], getattr(importlib.import_module(module), function))
    return build(config)
