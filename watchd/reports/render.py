"""The usage report as a table, CSV, JSON or Markdown (pure: report -> text); the formats are rows of
:data:`watchd.reports.formats.REPORT_FORMATS`."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from watchd.reports.core import reasons_text
from watchd.reports.model import UsageReport, UsageRow

_Col = tuple[str, Callable[[UsageRow], Any]]


def _key_getter(dim: str) -> Callable[[UsageRow], Any]:
    return lambda r: r.key[dim]


def _columns(report: UsageReport) -> list[_Col]:
    cols: list[_Col] = [(d, _key_getter(d)) for d in report.by]
    cols += [
        ("gpu_hours", lambda r: r.gpu_hours),
        ("usage_pct", lambda r: 100.0 * r.usage_fraction),
        ("share_pct", lambda r: None if r.norm_shares is None else 100.0 * r.norm_shares),
        ("fairshare", lambda r: r.fairshare),
        ("jobs", lambda r: r.jobs),
        ("wait_p50_s", lambda r: r.wait_p50_s),
        ("wait_p95_s", lambda r: r.wait_p95_s),
        ("wait_max_s", lambda r: r.wait_max_s),
        ("pending", lambda r: r.pending),
        ("pending_wait_max_s", lambda r: r.pending_wait_max_s),
        ("pending_reasons", lambda r: reasons_text(r.pending_reasons)),
        ("energy_kwh", lambda r: r.energy_kwh),
        ("idle_gpu_hours", lambda r: r.idle_gpu_hours),
        ("lost_gpu_hours", lambda r: r.lost_gpu_hours),
    ]
    return cols


#: what people read above each column of the HTML page (CSV, JSON and the terminal table keep the names, which
#: the page gives as each head's tooltip)
COLUMN_TITLES = {
    "account": "account",
    "user": "user",
    "partition": "partition",
    "gpu_hours": "GPU-hours",
    "usage_pct": "share (%)",
    "share_pct": "target (%)",
    "fairshare": "fair-share",
    "jobs": "jobs",
    "wait_p50_s": "wait p50 (s)",
    "wait_p95_s": "wait p95 (s)",
    "wait_max_s": "wait max (s)",
    "pending": "pending",
    "pending_wait_max_s": "pending max (s)",
    "pending_reasons": "why pending",
    "energy_kwh": "energy (kWh)",
    "idle_gpu_hours": "idle GPU-hours",
    "lost_gpu_hours": "lost GPU-hours",
}


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


def header(report: UsageReport) -> str:
    src = (
        "Slurm accounting (sacct, sshare, squeue)"
        if report.accounting
        else f"NO ACCOUNTING: {report.accounting_note or 'unavailable'}; what watchd observed itself"
    )
    return (
        f"usage {_when(report.start)} .. {_when(report.end)} by {', '.join(report.by)}; "
        f"{report.total_gpu_hours:.1f} GPU-hours; source: {src}"
    )


def to_table(report: UsageReport) -> str:
    cols = _columns(report)
    rows = [[_fmt(get(r)) for _, get in cols] for r in report.rows]
    widths = [max([len(name)] + [len(row[i]) for row in rows]) for i, (name, _) in enumerate(cols)]
    lines = [header(report), "  ".join(n.ljust(w) for (n, _), w in zip(cols, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if not report.rows:
        lines.append("(no usage in the window)")
    return "\n".join(lines) + "\n"


#: what a spreadsheet takes as the start of a formula (OWASP, CSV injection)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
#: a text cell with one of these is quoted: the separators of every locale (a ``;`` inside an unquoted cell
#: starts a new cell where ``;`` separates, and that one could be a formula), quotes and line breaks
_QUOTED_IF = frozenset(',;\t|"\r\n')


def _csv_cell(value: Any) -> str:
    """One CSV cell. A text cell a spreadsheet would run as a formula (``=HYPERLINK(...)`` as an account
    name) is shown as text the OWASP way, with a leading ``'``; a text cell with a separator of any locale,
    a quote or a line break is quoted (its quotes doubled). Numbers as Python writes them; None empty."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return str(value)
    text: str = "'" + value if value.startswith(_FORMULA_START) else value
    if _QUOTED_IF.intersection(text):
        return '"' + text.replace('"', '""') + '"'
    return text


def to_csv(report: UsageReport) -> str:
    """One row per group, cells by :func:`_csv_cell` (what ``csv.writer`` wrote, but for the cells that
    could be formulas and the separators of other locales)."""
    cols = _columns(report)
    lines = [",".join(_csv_cell(n) for n, _ in cols)]
    lines += [",".join(_csv_cell(get(r)) for _, get in cols) for r in report.rows]
    return "\n".join(lines) + "\n"


#: Markdown that would render as HTML, a link, code, or end a table cell or row: escaped or replaced
_MARKDOWN = str.maketrans(
    {
        "\\": "\\\\",  # a name ending in \ must not escape the cell's separator
        "|": "\\|",
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        "[": "\\[",
        "]": "\\]",
        "`": "\\`",
        "\n": " ",
        "\r": " ",
    }
)


def _md(text: str) -> str:
    """Text from the scheduler (names, reasons, an error) as Markdown text: no raw HTML (``&lt;``), no link
    or code span, no line break or ``|`` that would end the table's cell or row."""
    return text.translate(_MARKDOWN)


def to_markdown(report: UsageReport) -> str:
    cols = _columns(report)
    lines = [f"**{_md(header(report))}**", "", "| " + " | ".join(n for n, _ in cols) + " |"]
    lines.append("|" + "|".join("---" for _ in cols) + "|")
    for r in report.rows:
        lines.append("| " + " | ".join(_md(_fmt(get(r))) for _, get in cols) + " |")
    return "\n".join(lines) + "\n"


def to_json(report: UsageReport) -> str:
    doc: dict[str, Any] = {
        "start": report.start,
        "end": report.end,
        "by": list(report.by),
        "accounting": report.accounting,
        "accounting_note": report.accounting_note,
        "total_gpu_hours": report.total_gpu_hours,
        "idle_util_pct": report.idle_util_pct,
        "rows": [asdict(r) for r in report.rows],
        "lost_jobs": [asdict(j) for j in report.lost_jobs],
        "pending": [asdict(p) for p in report.pending],
        "series": {"bucket_starts": report.bucket_starts, "gpu_hours": report.series},
        "wait_histograms": report.wait_histograms,
    }
    return json.dumps(_finite(doc), indent=2, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    """JSON has no infinity (sshare's LevelFS of an unused association): such values become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
