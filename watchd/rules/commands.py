"""``watchd rules check|list|test|schema``: what the command line runs, writing to ``out`` and returning the
exit status (0: fine, 1: a problem in the rules or a failed test)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from watchd.errors import ConfigError
from watchd.rules.effective import EffectiveRules, effective_rules
from watchd.rules.loader import EMBEDDED, default_rules
from watchd.rules.model import json_schema
from watchd.rules.unit_tests import run_test_files

__all__ = ["run_check", "run_list", "run_schema", "run_test"]


def run_check(paths: Sequence[Path], out: TextIO, *, defaults: bool = True, as_json: bool = False) -> int:
    """``watchd rules check [PATH...]``: every problem as ``file:line:column: message``, then one summary
    line. Files or folders (every ``*.yaml``/``*.yml`` in it), checked as the engine loads them: with the
    embedded default rules unless ``defaults`` is false (a site rule that takes a default's name without
    ``replaces: default`` is a problem); none: the embedded default rules alone."""
    try:
        effective = effective_rules(paths, defaults=defaults)
    except ConfigError as exc:  # a file that exists but cannot be read
        if as_json:
            doc = {
                "ok": False,
                "problems": [{"file": None, "line": None, "column": None, "message": str(exc)}],
            }
            out.write(json.dumps({**doc, "summary": "1 problem"}, indent=2) + "\n")
        else:
            out.write(f"{exc}\n1 problem\n")
        return 1
    where = ", ".join(str(p) for p in paths) or EMBEDDED
    n = len(effective.problems)
    summary = (
        f"{n} problem{'s' if n != 1 else ''} in {where}" if n else _summary(effective, bool(paths), defaults)
    )
    if as_json:
        problems = [
            {"file": p.file, "line": p.line, "column": p.column, "message": p.message}
            for p in effective.problems
        ]
        doc = {"ok": not n, "problems": problems, "rules": len(effective.rules), "summary": summary}
        out.write(json.dumps(doc, indent=2) + "\n")
        return 1 if n else 0
    for problem in effective.problems:
        out.write(f"{problem}\n")
    out.write(summary + "\n")
    return 1 if n else 0


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _summary(effective: EffectiveRules, site: bool, defaults: bool) -> str:
    """``ok: 3 rules in 1 file, with 35 default rules (1 replaced, 0 disabled): 38 active``."""
    if not site:
        return f"ok: {_plural(len(effective.rules), 'rule')} in {_plural(len(default_rules()), 'file')}"
    counts = Counter((e.origin, e.state) for e in effective.entries)
    own = counts["site", "active"]
    text = f"ok: {_plural(own, 'rule')} in {_plural(effective.site_files, 'file')}"
    if effective.pack_copies:
        text += f" (and {_plural(effective.pack_copies, 'file')} of the default pack itself)"
    if defaults:
        text += (
            f", with {_plural(counts['default', 'active'], 'default rule')} "
            f"({counts['default', 'replaced']} replaced, {counts['default', 'disabled']} disabled): "
            f"{len(effective.rules)} active"
        )
    return text


def run_list(paths: Sequence[Path], out: TextIO, *, defaults: bool = True, as_json: bool = False) -> int:
    """``watchd rules list``: every rule the engine would load, where it came from (a site file:line, or
    ``default`` with its place in the embedded pack) and whether it runs; the default rules a site replaced
    or disabled too, with where. Exit 1 (and the problems) when the set would not load."""
    try:
        effective = effective_rules(paths, defaults=defaults)
    except ConfigError as exc:
        out.write(f"{exc}\n")
        return 1
    if effective.problems:
        for problem in effective.problems:
            out.write(f"{problem}\n")
        n = len(effective.problems)
        out.write(f"{n} problem{'s' if n != 1 else ''}: the engine would refuse these rules\n")
        return 1
    if as_json:
        doc = {"rules": [e.as_dict() for e in effective.entries], "active": len(effective.rules)}
        out.write(json.dumps(doc, indent=2) + "\n")
        return 0
    width = max(len(e.name) for e in effective.entries) if effective.entries else 4
    out.write(f"{'RULE':<{width}}  {'STATE':<8}  {'ORIGIN':<7}  SOURCE\n")
    for e in effective.entries:
        source = e.source
        if e.by is not None:
            source += f" ({e.state} at {e.by})"
        elif e.state == "off":
            source += " (default_rules: false)"
        out.write(f"{e.name:<{width}}  {e.state:<8}  {e.origin:<7}  {source}\n")
    out.write(f"{len(effective.rules)} active\n")
    return 0


def run_test(paths: Sequence[Path], out: TextIO, *, as_json: bool = False, junit: Path | None = None) -> int:
    """``watchd rules test PATH...``: run rule unit tests, files or folders of them (see
    :mod:`watchd.rules.unit_tests`); ``--json`` for one document, ``--junit FILE`` for a site's CI."""
    return run_test_files(paths, out, as_json=as_json, junit_file=junit)


def run_schema(out: TextIO) -> int:
    """``watchd rules schema``: the JSON Schema of a rule file, for editors."""
    out.write(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")
    return 0
