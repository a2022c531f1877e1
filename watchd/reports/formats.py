"""The report formats, one row each: the name ``--format`` takes, the function that renders a
:class:`~watchd.reports.model.UsageReport` as that text, and what it is for. The command-line choices and
:func:`watchd.reports.command.render` both read this table. Pure and cheap to import (the CLI builds its
parser from it): a renderer is named ``"module:function"`` and imported only when its format is chosen."""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RENDER_OPTIONS", "REPORT_FORMATS", "ReportFormat"]

#: the options a renderer may take as keywords (``options`` of a row), given by the command
RENDER_OPTIONS = ("max_accounts",)


@dataclass(frozen=True, slots=True)
class ReportFormat:
    renderer: str  # "module:function": (report, **options) -> text
    description: str
    options: tuple[str, ...] = ()  # of RENDER_OPTIONS


REPORT_FORMATS: Mapping[str, ReportFormat] = types.MappingProxyType(
    {
        "table": ReportFormat("watchd.reports.render:to_table", "aligned columns for a terminal"),
        "csv": ReportFormat("watchd.reports.render:to_csv", "one row per group, for spreadsheets"),
        "json": ReportFormat("watchd.reports.render:to_json", "the whole report as one document"),
        "markdown": ReportFormat("watchd.reports.render:to_markdown", "a table for tickets and wikis"),
        "html": ReportFormat("watchd.reports.html:to_html", "one self-contained page, table and plots"),
        "prometheus": ReportFormat(
            "watchd.reports.metrics:to_prometheus",
            "text exposition for node-exporter's textfile collector",
            options=("max_accounts",),
        ),
    }
)
