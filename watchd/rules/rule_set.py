"""A complete, valid set of rules, as the loader (watchd/rules/loader.py) builds it."""

from __future__ import annotations

from dataclasses import dataclass

from watchd.rules.rule import Rule
from watchd.rules.rule_engine import RuleEngine


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rules]

    def engine(self) -> RuleEngine:
        return RuleEngine(self.rules)
