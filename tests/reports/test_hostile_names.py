"""Names the scheduler hands over (accounts, users, partitions, pending reasons, the note of an accounting
that failed) reach spreadsheets and rendered Markdown: a CSV cell that a spreadsheet would run as a formula is
neutralised the OWASP way (a leading ``'`` on a text cell starting with ``=``, ``+``, ``-``, ``@``, tab or
carriage return; a text cell with a separator of any locale quoted, so that it never starts a new cell), and
Markdown carries no raw HTML and no cell that breaks out of its table."""

from __future__ import annotations

import csv
import io

import pytest

from watchd.reports.core import build_report
from watchd.reports.model import Accounting, JobRecord, Observed, PendingJob
from watchd.reports.render import to_csv, to_markdown

H = 3600.0
T = 1_800_000_000.0

#: name -> what a spreadsheet must show of it (the OWASP prefix on a would-be formula)
FORMULAS = {
    '=HYPERLINK("http://x","y")': '\'=HYPERLINK("http://x","y")',
    "+1+2": "'+1+2",
    "-2+3": "'-2+3",
    "@SUM(A1:A9)": "'@SUM(A1:A9)",
    "\t=1": "'\t=1",
    "\r=1": "'\r=1",
    "a;=1+1": "a;=1+1",  # starts harmlessly; quoted, so that a ';' locale keeps it one cell
    'say "hi"': 'say "hi"',
    "team-a": "team-a",
}
HTML = "<img src=x onerror=alert(1)>"


def _report(accounts: list[str], why: str = "") -> object:
    jobs = tuple(
        JobRecord(str(i), name, "u", "gpu", 1, T, T + 60, T + 2 * H, "COMPLETED", ("n1",))
        for i, name in enumerate(accounts)
    )
    pending = (PendingJob("99", accounts[0], "u", "gpu", 1, T, f"<b>{HTML}</b>"),)
    return build_report(
        Accounting(not why, why=why, jobs=jobs, pending=pending),
        Observed(),
        start=T,
        end=T + 10 * H,
        now=T + 10 * H,
        by=("account",),
    )


def test_csv_neutralises_formula_cells() -> None:
    text = to_csv(_report(list(FORMULAS)))  # type: ignore[arg-type]
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0][:2] == ["account", "gpu_hours"]  # the header as before
    shown = {row[0] for row in rows[1:]}
    assert shown == set(FORMULAS.values()), shown
    for row in rows[1:]:
        for cell in row:
            assert not cell or cell[0] not in "=+-@\t\r", row
    assert '\n"a;=1+1",' in text and '\n"\'\r=1",' in text and '\n"\'\t=1",' in text
    assert "\nteam-a," in text and '\n"say ""hi""",' in text  # quoted where a separator could split it


def test_csv_keeps_numbers_numbers() -> None:
    rows = list(csv.reader(io.StringIO(to_csv(_report(["a"])), newline="")))  # type: ignore[arg-type]
    assert float(rows[1][1]) == pytest.approx(2 * H / H - 60 / H)


def test_markdown_carries_no_raw_html_nor_breaks_its_table() -> None:
    names = [HTML, "<script>alert(1)</script>", "a|b", "back\\", "two\nlines", "[x](javascript:alert(1))"]
    text = to_markdown(_report(names))  # type: ignore[arg-type]
    assert "<" not in text and ">" not in text, text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "&lt;script&gt;" in text
    lines = text.splitlines()
    table = [line for line in lines if line.startswith("|")]
    columns = table[0].count(" | ")
    for line in [table[0], *table[2:]]:  # as many unescaped separators as the header: no cell broke out
        assert line.replace("\\|", "").count(" | ") == columns, line
    assert len(table) == 2 + len(names), table  # no row split by a line break
    assert "\\[x\\](javascript:alert(1))" in text  # no link made of a name


def test_markdown_escapes_the_header_too() -> None:
    text = to_markdown(_report(["a"], why=f"sacct failed: {HTML}"))  # type: ignore[arg-type]
    assert "NO ACCOUNTING" in text and "<" not in text and "&lt;img" in text, text
