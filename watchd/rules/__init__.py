"""Remediation rules: a strict YAML language (model), compiled once (match, template, ruleset), evaluated
over event streams (state), loaded with positions for every problem (loader)."""

from watchd.rules.loader import Problem, RuleSet, check_rules, default_rules, load_rules, parse_rule_file
from watchd.rules.model import DISRUPTIVE, ActionKind, Mode, RuleSpec, json_schema
from watchd.rules.ruleset import Decision, PlannedAction, Rule, plan
from watchd.rules.state import RuleEngine, decisions_for

__all__ = [
    "DISRUPTIVE",
    "ActionKind",
    "Decision",
    "Mode",
    "PlannedAction",
    "Problem",
    "Rule",
    "RuleEngine",
    "RuleSet",
    "RuleSpec",
    "check_rules",
    "decisions_for",
    "default_rules",
    "json_schema",
    "load_rules",
    "parse_rule_file",
    "plan",
]
