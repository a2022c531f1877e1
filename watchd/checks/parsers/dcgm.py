"""``dcgmi diag`` output: the table of DCGM 3.x and 4.x and the JSON of ``-j`` (both versions).

Table, DCGM 3.x: one row per test with ``Pass``, ``Fail``, ``Warn``, ``Skip`` (``- All`` or ``- GPU: 0,1``
may follow), ``Info``/``Warning``/``Error`` rows below a test, a ``Metadata`` section from 3.3 on. DCGM 4.x:
lower-case plugin names (``software``, ``memory``, ``pcie``), the test's status alone, then per-GPU rows
(``GPU0: Pass``) in the continuation cells. Long cells wrap across rows with an empty first column; the parser
joins them. JSON: ``"DCGM GPU Diagnostic"`` (3.x: ``gpu_ids``, statuses in capitals, ``warnings`` as
strings) or ``"DCGM Diagnostic"`` (4.x: ``entity_id``, ``test_summary``, ``warnings`` as objects), possibly
after other lines and with ``null`` entries in lists.

Every status is normalised to ``pass``, ``fail``, ``warn`` or ``skip`` (anything else is kept lower-case).
Nothing here raises: what cannot be read is reported in ``errors``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DcgmReport", "DcgmTest", "parse_dcgm"]

_SECTION = re.compile(r"^[|+]-{3,}\s+([A-Za-z][A-Za-z ]*?)\s+-+[+|]")
_GPU_STATUS = re.compile(r"^GPU\s*(\d+)\s*:\s*(\w+)")
_STATUS_WORDS = {
    "pass": "pass",
    "passed": "pass",
    "fail": "fail",
    "failed": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "skipped": "skip",
}
_MESSAGE_ROWS = {"info", "warning", "error"}
_META = {"dcgm version": "version", "driver version detected": "driver"}
_MAX_MESSAGE = 1000
_MAX_LINE = 4096


def _status(word: str) -> str:
    w = word.strip().split(" ", 1)[0].strip(" -:").lower()
    return _STATUS_WORDS.get(w, w)


@dataclass
class DcgmTest:
    name: str
    category: str
    status: str  # pass | fail | warn | skip
    messages: list[str] = field(default_factory=list)  # Warning/Error/Info text (and JSON warnings)
    gpus: dict[int, str] = field(default_factory=dict)  # GPU index -> status, where given


@dataclass
class DcgmReport:
    tests: list[DcgmTest] = field(default_factory=list)
    version: str | None = None
    driver: str | None = None
    form: str = "none"  # table | json | none
    errors: list[str] = field(default_factory=list)  # "Error: ..." lines, or why the output was unreadable
    complete: bool = False  # the table's closing border or a whole JSON document was seen

    def with_status(self, status: str) -> list[DcgmTest]:
        return [t for t in self.tests if t.status == status]

    @property
    def failed(self) -> bool:
        return bool(self.errors) or any(t.status == "fail" for t in self.tests)


def parse_dcgm(text: str) -> DcgmReport:
    start = text.find("{")
    if start >= 0 and "+---" not in text[:start]:
        report = _parse_json(text, start)
        if report is not None:
            return report
    return _parse_table(text)


# ----------------------------------------------------------------------------------------------- table


def _cells(line: str) -> tuple[str, str] | None:
    if not line.startswith("|") or line.count("|") < 3:
        return None
    parts = line.split("|")
    return parts[1], parts[2]


def _parse_table(text: str) -> DcgmReport:
    report = DcgmReport()
    category = ""
    current: DcgmTest | None = None
    parts: list[str] = []  # the rows of the message being joined
    joining = False
    prefix = ""
    seen_table = False

    def set_message() -> None:
        if current is not None:
            current.messages[-1] = " ".join((prefix + "".join(parts)).split())[:_MAX_MESSAGE]

    for raw in text.splitlines():
        line = raw[:_MAX_LINE].rstrip()
        stripped = line.strip()
        if stripped.startswith("Error:"):
            report.errors.append(stripped)
            continue
        if not stripped.startswith(("|", "+")):
            continue
        seen_table = True
        if (m := _SECTION.match(stripped)) is not None:
            category = m.group(1).strip()
            current, joining = None, False
            continue
        if re.fullmatch(r"\+[-=+]+\+", stripped):
            if "=" not in stripped and report.tests:
                report.complete = True  # the closing border after the tests
            continue
        cells = _cells(stripped)
        if cells is None:
            continue
        name, value = cells[0].strip(), cells[1]
        # a wrapped cell is cut every (width - 3) characters, blanks included: keep them to join the rows
        segment = value[1:-2] if len(value) > 3 else value.strip()
        if not name:  # a continuation row
            gpu = _GPU_STATUS.match(segment.strip())
            if gpu is not None and current is not None:
                current.gpus[int(gpu.group(1))] = _status(gpu.group(2))
                joining = False
            elif joining:
                parts.append(segment)
                set_message()
            continue
        key = name.lower()
        if key == "diagnostic":
            continue
        if category.lower() == "metadata" or key in _META:
            attr = _META.get(key)
            if attr is not None:
                setattr(report, attr, segment.strip())
            continue
        if key in _MESSAGE_ROWS:
            if current is None:  # an Error row before any test (the Deployment checks)
                current = DcgmTest(name=category.lower() or "diagnostic", category=category, status="fail")
                report.tests.append(current)
            if key == "error" and current.status in ("pass", "skip"):
                current.status = "fail"
            prefix = "info: " if key == "info" else ""
            parts = [segment]
            current.messages.append("")
            set_message()
            joining = True
            continue
        current = DcgmTest(name=name, category=category, status=_status(segment))
        report.tests.append(current)
        joining = False
    if seen_table:
        report.form = "table"
    return report


# ------------------------------------------------------------------------------------------------ JSON


def _parse_json(text: str, start: int) -> DcgmReport | None:
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError as exc:
        stripped = text[start:].strip()
        if stripped.startswith("{") and ('"name"' in stripped or '"DCGM' in stripped):
            return DcgmReport(form="json", errors=[f"dcgmi diag -j: not a whole JSON document ({exc})"])
        return None
    if not isinstance(doc, dict):
        return None
    body = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic")
    if not isinstance(body, dict):
        if "runtime_error" in doc or "error" in doc:
            return DcgmReport(form="json", errors=[str(doc.get("runtime_error") or doc.get("error"))])
        return DcgmReport(form="json", errors=["dcgmi diag -j: no 'DCGM Diagnostic' object"])
    report = DcgmReport(form="json", complete=True)
    meta_doc = doc.get("metadata")
    meta: dict[str, Any] = meta_doc if isinstance(meta_doc, dict) else {}
    report.version = _str(body.get("version")) or _str(meta.get("version"))
    report.driver = (
        _str(body.get("Driver Version Detected"))
        or _str(body.get("driver_version_detected"))
        or _str(meta.get("Driver Version Detected"))
    )
    if body.get("runtime_error"):
        report.errors.append(str(body["runtime_error"]))
    for category in _list(body.get("test_categories")):
        cat = _str(category.get("category")) or ""
        for test in _list(category.get("tests")):
            report.tests.append(_json_test(test, cat))
    return report


def _list(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


_ORDER = {"fail": 3, "warn": 2, "pass": 1, "skip": 0}


def _json_test(test: dict[str, Any], category: str) -> DcgmTest:
    out = DcgmTest(name=_str(test.get("name")) or "?", category=category, status="skip")
    statuses: list[str] = []
    for result in _list(test.get("results")):
        status = _status(str(result.get("status", "")))
        statuses.append(status)
        gpu = result.get("entity_id", result.get("gpu_id", result.get("gpu_ids")))
        if isinstance(gpu, int) and not isinstance(gpu, bool):
            out.gpus[gpu] = status
        elif isinstance(gpu, str) and gpu.isdigit():
            out.gpus[int(gpu)] = status
        for w in result.get("warnings") or []:
            text = w.get("warning") if isinstance(w, dict) else w
            if isinstance(text, str):
                out.messages.append(" ".join(text.split())[:_MAX_MESSAGE])
    summary = test.get("test_summary")
    if isinstance(summary, dict) and isinstance(summary.get("status"), str):
        out.status = _status(summary["status"])
    elif statuses:
        out.status = max(statuses, key=lambda s: _ORDER.get(s, 4))
    return out
