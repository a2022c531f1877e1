"""The engine's rule set: the default pack shipped inside the package, plus the site's rule files.

A site's files add to the defaults. A site rule takes the place of a default rule only when it says so
(``replaces: default``, with the default's name); a rule file's ``disable_defaults: [NAME, ...]`` turns
default rules off. A site rule that has a default rule's name without ``replaces: default`` is a problem
naming both files, never a silent shadow. ``default_rules: false`` in the engine config leaves the defaults
out (the names in ``replaces``/``disable_defaults`` are still checked against the pack, so a typo never
passes). A site file whose text is exactly one of the pack's files (the repository's ``rules/`` links, a
copy of the pack) is that default file, loaded once.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from watchd.errors import ConfigError
from watchd.rules.loader import Problem, default_rules, parse_sources, read_rule_files
from watchd.rules.rule import Rule
from watchd.rules.rule_set import RuleSet

__all__ = ["EffectiveRules", "RuleEntry", "effective_rules", "load_rules"]

State = Literal["active", "replaced", "disabled", "off"]


@dataclass(frozen=True, slots=True)
class RuleEntry:
    """One rule in the listing: where it came from and whether it runs. ``by`` is where a default was
    replaced or disabled (file:line); ``off``: the defaults are off in the engine config."""

    name: str
    origin: Literal["default", "site"]
    source: str  # file:line (a default's: <embedded rules/FILE>:LINE)
    state: State
    by: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {
            "name": self.name,
            "origin": self.origin,
            "source": self.source,
            "state": self.state,
            "by": self.by,
        }


@dataclass(frozen=True, slots=True)
class EffectiveRules:
    rules: list[Rule]  # what the engine evaluates, in order (the defaults first)
    entries: list[RuleEntry]  # every default and every site rule, with its state
    problems: list[Problem]
    site_files: int  # files of the site's rules
    pack_copies: int  # files given whose text is one of the default pack's (loaded as the defaults)


def _suggest(name: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _at(rule: Rule) -> tuple[str, int]:
    file, line = rule.source.rsplit(":", 1)
    return file, int(line)


def effective_rules(paths: Sequence[Path], *, defaults: bool = True) -> EffectiveRules:
    """The defaults (unless ``defaults`` is false) and the rules of ``paths``, composed; every problem."""
    pack = default_rules()
    pack_texts = {text for text, _ in pack}
    parsed_pack = parse_sources(pack)
    by_name = {r.name: r for r in parsed_pack.rules}
    read, problems = read_rule_files(paths)
    # a file identical to one of the pack's is that default file (with the defaults on: loaded once)
    site_sources = [(text, f) for text, f in read if not (defaults and text in pack_texts)]
    site = parse_sources(site_sources, first_order=len(parsed_pack.rules))
    problems += parsed_pack.problems + site.problems

    replaced: dict[str, str] = {}
    for rule in site.rules:
        file, line = _at(rule)
        if rule.spec.replaces == "default":
            if rule.name in by_name:
                replaced[rule.name] = rule.source
            else:
                problems.append(
                    Problem(
                        file,
                        line,
                        1,
                        f"rule {rule.name!r}: replaces: default, but no default rule is named "
                        f"{rule.name!r}{_suggest(rule.name, list(by_name))}",
                    )
                )
        elif defaults and rule.name in by_name:
            problems.append(
                Problem(
                    file,
                    line,
                    1,
                    f"rule {rule.name!r} has the name of the default rule at {by_name[rule.name].source}: "
                    "to run this one instead, add 'replaces: default' to it; to keep both, rename it",
                )
            )
    disabled: dict[str, str] = {}
    for entry in site.disabled:
        if entry.name not in by_name:
            problems.append(
                Problem(
                    entry.file,
                    entry.line,
                    entry.column,
                    f"disable_defaults: no default rule is named {entry.name!r}"
                    f"{_suggest(entry.name, list(by_name))}",
                )
            )
        elif entry.name in replaced:
            problems.append(
                Problem(
                    entry.file,
                    entry.line,
                    entry.column,
                    f"disable_defaults: {entry.name!r} is also replaced (at {replaced[entry.name]}): "
                    "disable it or replace it, not both",
                )
            )
        else:
            disabled.setdefault(entry.name, entry.where)

    rules: list[Rule] = []
    entries: list[RuleEntry] = []
    for rule in parsed_pack.rules:
        state: State = "active"
        by = None
        if not defaults:
            state = "off"
        elif rule.name in replaced:
            state, by = "replaced", replaced[rule.name]
        elif rule.name in disabled:
            state, by = "disabled", disabled[rule.name]
        else:
            rules.append(rule)
        entries.append(RuleEntry(rule.name, "default", rule.source, state, by))
    for rule in site.rules:
        rules.append(rule)
        entries.append(RuleEntry(rule.name, "site", rule.source, "active"))
    files = len({f for _, f in site_sources})
    return EffectiveRules(rules, entries, problems, files, len(read) - len(site_sources))


def load_rules(paths: Sequence[Path], *, defaults: bool = True) -> RuleSet:
    """The engine's complete rule set (see :func:`effective_rules`), or a ConfigError listing every
    problem."""
    effective = effective_rules(paths, defaults=defaults)
    if effective.problems:
        raise ConfigError("\n".join(str(p) for p in effective.problems))
    return RuleSet(tuple(effective.rules))
