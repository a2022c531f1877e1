"""Durations in rule files: vocabulary shared with the action handlers' parameters (watchd.model)."""

from watchd.model.durations import DURATION_JSON_SCHEMA, Duration, parse_duration

__all__ = ["DURATION_JSON_SCHEMA", "Duration", "parse_duration"]
