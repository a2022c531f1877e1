"""The table of report formats (watchd/reports/formats.py): the CLI offers exactly its rows, each row
renders, and the table stays cheap to import (the CLI builds its parser from it)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from watchd.cli_parser import parser as _parser
from watchd.errors import UsageError
from watchd.reports.command import render
from watchd.reports.core import build_report
from watchd.reports.formats import RENDER_OPTIONS, REPORT_FORMATS
from watchd.reports.model import Accounting, JobRecord, Observed

H = 3600.0
T = 1_800_000_000.0


def _report_usage_format() -> argparse.Action:
    report = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "report"
    ]
    sub = next(a for a in report._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in sub.choices["usage"]._actions if a.dest == "format")


def test_the_cli_offers_exactly_the_table() -> None:
    action = _report_usage_format()
    assert list(action.choices or ()) == list(REPORT_FORMATS)
    assert action.default in REPORT_FORMATS


@pytest.mark.parametrize("fmt", list(REPORT_FORMATS))
def test_every_format_renders(fmt: str) -> None:
    row = REPORT_FORMATS[fmt]
    assert set(row.options) <= set(RENDER_OPTIONS)
    jobs = tuple(
        JobRecord(str(i), f"team{i}", "u", "gpu", 4 - i, T, T + 60, T + 2 * H, "COMPLETED", ("n1",))
        for i in range(3)
    )
    report = build_report(
        Accounting(True, jobs=jobs), Observed(), start=T, end=T + 10 * H, now=T + 10 * H, by=("account",)
    )
    text = render(report, fmt, max_accounts=2)
    assert "team1" in text
    if "max_accounts" in row.options:  # the option reaches the renderer: two accounts, the rest summed
        assert "team2" not in text and "(other)" in text


def test_an_unknown_format_names_the_known_ones() -> None:
    assert {"table", "csv", "json", "markdown", "html", "prometheus"} <= set(
        REPORT_FORMATS
    )  # scripts use them
    report = build_report(Accounting(True), Observed(), start=T, end=T + H, now=T + H, by=("account",))
    with pytest.raises(
        UsageError, match=re.escape(f"unknown format 'pdf' (known: {', '.join(REPORT_FORMATS)})")
    ):
        render(report, "pdf")


def test_the_table_imports_no_renderer() -> None:
    code = (
        "import sys, watchd.reports.formats\n"
        "print(sorted(m for m in sys.modules if m.startswith(('watchd.reports.', 'prometheus_client'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['watchd.reports.formats']"
