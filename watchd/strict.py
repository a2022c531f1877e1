"""The base of every YAML-facing model (daemon config, rules, rule tests, detector parameters, scenarios):
unknown keys are rejected and values are frozen, so a typo is an error with its key path, never ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
