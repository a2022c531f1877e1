"""Remediation rules: a strict YAML language (model, loader, rule_set), its meaning interpreted in
specification (docs/rules.md, written as code), evaluated in production by rule_engine over the generated
fast path (compiled/, held to the specification by tests/rules/test_compiled_contract.py); unit_tests is
``watchd rules test``, commands the ``watchd rules`` command line."""

from watchd.rules.decision import Decision, PlannedAction
from watchd.rules.effective import EffectiveRules, RuleEntry, effective_rules, load_rules
from watchd.rules.limits import Mode
from watchd.rules.loader import Problem, check_rules, default_rules, parse_rule_file
from watchd.rules.model import DISRUPTIVE, ActionKind, RuleSpec, json_schema
from watchd.rules.rule import Rule, plan
from watchd.rules.rule_engine import RuleEngine, decisions_for
from watchd.rules.rule_set import RuleSet
from watchd.rules.specification import Interpreter

__all__ = [
    "DISRUPTIVE",
    "ActionKind",
    "Decision",
    "EffectiveRules",
    "Interpreter",
    "Mode",
    "PlannedAction",
    "Problem",
    "Rule",
    "RuleEngine",
    "RuleEntry",
    "RuleSet",
    "RuleSpec",
    "check_rules",
    "decisions_for",
    "default_rules",
    "effective_rules",
    "json_schema",
    "load_rules",
    "parse_rule_file",
    "plan",
]
