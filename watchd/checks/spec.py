"""What a check kind's default command and its judge read of a check's configuration (``CheckSpec``) and of
a bandwidth baseline (``Baseline``), as protocols: the kinds' table sits below the configuration that names
its rows, never beside it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["BaselineView", "SpecView"]


class SpecView(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def command(self) -> list[str] | None: ...
    @property
    def level(self) -> int: ...
    @property
    def json_output(self) -> bool: ...
    @property
    def fail_on_warn(self) -> bool: ...
    @property
    def threshold(self) -> float: ...
    @property
    def baseline_gbps(self) -> float | None: ...


class BaselineView(Protocol):
    @property
    def gpu_model(self) -> str | None: ...
    @property
    def nodes(self) -> Sequence[str]: ...
    @property
    def busbw_gbps(self) -> float: ...
    @property
    def scope(self) -> str: ...
