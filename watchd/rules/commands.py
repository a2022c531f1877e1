"""``watchd rules check|test|schema``: what the command line runs, writing to ``out`` and returning the exit
status (0: fine, 1: a problem in the rules or a failed test)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from watchd.errors import ConfigError
from watchd.rules.loader import EMBEDDED, check_rules
from watchd.rules.model import json_schema
from watchd.rules.unit_tests import run_test_files

__all__ = ["run_check", "run_schema", "run_test"]


def run_check(paths: Sequence[Path], out: TextIO) -> int:
    """``watchd rules check [PATH...]``: every problem as ``file:line:column: message``, then one summary
    line. Files or folders (every ``*.yaml``/``*.yml`` in it); none: the embedded default rules."""
    try:
        rules, problems = check_rules(paths)
    except ConfigError as exc:  # a file that exists but cannot be read
        out.write(f"{exc}\n1 problem\n")
        return 1
    for problem in problems:
        out.write(f"{problem}\n")
    files = len({r.source.rsplit(":", 1)[0] for r in rules})
    where = ", ".join(str(p) for p in paths) or EMBEDDED
    if problems:
        n = len(problems)
        out.write(f"{n} problem{'s' if n != 1 else ''} in {where}\n")
        return 1
    out.write(
        f"ok: {len(rules)} rule{'s' if len(rules) != 1 else ''} in {files} file{'s' if files != 1 else ''}\n"
    )
    return 0


def run_test(files: Sequence[Path], out: TextIO) -> int:
    """``watchd rules test FILE...``: run rule unit tests (see :mod:`watchd.rules.unit_tests`)."""
    return run_test_files(files, out)


def run_schema(out: TextIO) -> int:
    """``watchd rules schema``: the JSON Schema of a rule file, for editors."""
    out.write(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")
    return 0
