"""Running rule test files and folders, and showing what came out: for people (one line per test, a failure's
diff), as one JSON document, or as a JUnit XML report a site's CI shows (``watchd rules test --json``,
``--junit FILE``)."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from watchd.errors import UsageError
from watchd.rules.loader import Problem
from watchd.rules.unit_tests.runner import CaseOutcome, run_case
from watchd.rules.unit_tests.suite import load_test_file


@dataclass
class FileResult:
    """One test file: its tests' outcomes, or the problems that kept it from running."""

    source: str
    problems: list[Problem] = field(default_factory=list)
    cases: list[tuple[CaseOutcome, float]] = field(default_factory=list)  # with the seconds it took


@dataclass
class Results:
    files: list[FileResult]

    @property
    def passed(self) -> int:
        return sum(c.passed for f in self.files for c, _ in f.cases)

    @property
    def failed(self) -> int:
        return sum(not c.passed for f in self.files for c, _ in f.cases)

    @property
    def broken(self) -> int:
        return sum(bool(f.problems) for f in self.files)

    @property
    def ok(self) -> bool:
        return bool(self.files) and self.failed == 0 and self.broken == 0

    def summary(self) -> str:
        if not self.files:
            return "no test files given"
        text = f"{self.passed} passed, {self.failed} failed"
        if self.broken:
            text += f", {self.broken} file{'s' if self.broken > 1 else ''} with errors"
        return text


def _is_rule_file(path: Path) -> bool:
    """A rule file (a top-level ``rules:`` list and no ``tests:``), met in a folder of tests: not a test."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # reported when it is run as a test file
    return isinstance(data, dict) and "rules" in data and "tests" not in data


def test_files(paths: Sequence[Path]) -> list[Path]:
    """The test files ``paths`` stand for: a file itself; a folder's ``*.yaml``/``*.yml`` files, in its
    subfolders too, but for the rule files among them (a folder may hold rules and their tests)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
            found.extend(p for p in inside if not _is_rule_file(p))
        else:
            found.append(path)
    return found


def run_tests(paths: Sequence[Path]) -> Results:
    """Every test of every test file ``paths`` stand for; a folder with no test file is a problem."""
    files: list[FileResult] = []
    for path in paths:
        if path.is_dir() and not test_files([path]):
            files.append(
                FileResult(str(path), [Problem(str(path), 1, 1, "no rule test files in this folder")])
            )
    for path in test_files(paths):
        loaded, problems = load_test_file(path)
        result = FileResult(str(path), problems)
        if loaded is not None:
            for test in loaded.tests:
                started = time.perf_counter()
                outcome = run_case(test, loaded.rules, loaded.source)
                result.cases.append((outcome, time.perf_counter() - started))
        files.append(result)
    return Results(files)


def write_text(results: Results, out: TextIO) -> None:
    for f in results.files:
        for p in f.problems:
            out.write(f"{p}\n")
        for case, _ in f.cases:
            if case.passed:
                out.write(f"ok   {case.file}:{case.line}: {case.name}\n")
            else:
                out.write("\n".join(case.report) + "\n")
    out.write(results.summary() + "\n")


def _problem(p: Problem) -> dict[str, Any]:
    return {"file": p.file, "line": p.line, "column": p.column, "message": p.message}


def as_json(results: Results) -> dict[str, Any]:
    return {
        "ok": results.ok,
        "passed": results.passed,
        "failed": results.failed,
        "files_with_errors": results.broken,
        "files": [
            {
                "file": f.source,
                "problems": [_problem(p) for p in f.problems],
                "tests": [
                    {
                        "name": c.name,
                        "line": c.line,
                        "passed": c.passed,
                        "seconds": round(took, 6),
                        "report": c.report,
                    }
                    for c, took in f.cases
                ],
            }
            for f in results.files
        ],
    }


def write_json(results: Results, out: TextIO) -> None:
    out.write(json.dumps(as_json(results), indent=2) + "\n")


def junit(results: Results) -> bytes:
    """The JUnit XML report: a ``testsuite`` per test file, a ``testcase`` per test; a failed test has a
    ``failure`` with its diff, a file that could not run one ``testcase`` with an ``error``."""
    root = ET.Element("testsuites", name="watchd rules test")
    total_time = 0.0
    for f in results.files:
        took = sum(t for _, t in f.cases)
        total_time += took
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f.source,
            tests=str(len(f.cases) + (1 if f.problems else 0)),
            failures=str(sum(not c.passed for c, _ in f.cases)),
            errors=str(1 if f.problems else 0),
            skipped="0",
            time=f"{took:.6f}",
        )
        if f.problems:
            case = ET.SubElement(suite, "testcase", classname=f.source, name="(file)", file=f.source)
            error = ET.SubElement(
                case, "error", message=f"{len(f.problems)} problem(s) in the test file", type="RuleTestError"
            )
            error.text = "\n".join(str(p) for p in f.problems)
        for c, t in f.cases:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f.source,
                name=c.name,
                file=f.source,
                line=str(c.line),
                time=f"{t:.6f}",
            )
            if not c.passed:
                failure = ET.SubElement(
                    case,
                    "failure",
                    message="the decided actions differ from the expected",
                    type="RuleTestFailure",
                )
                failure.text = "\n".join(c.report)
    root.set("tests", str(sum(int(s.get("tests", "0")) for s in root)))
    root.set("failures", str(results.failed))
    root.set("errors", str(results.broken))
    root.set("time", f"{total_time:.6f}")
    ET.indent(root)
    text: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return text + b"\n"


def run_test_files(
    paths: Sequence[Path], out: TextIO, *, as_json: bool = False, junit_file: Path | None = None
) -> int:
    """Run every test of ``paths`` (files or folders); print each result and ``N passed, N failed`` (or the
    JSON document), and write the JUnit report to ``junit_file``. 0 when all pass, 1 when a test fails or a
    file has problems."""
    results = run_tests(paths)
    if junit_file is not None:
        try:
            junit_file.write_bytes(junit(results))
        except OSError as exc:
            raise UsageError(f"--junit {junit_file}: cannot write: {exc.strerror}") from None
    if as_json:
        write_json(results, out)
    else:
        write_text(results, out)
    return 0 if results.ok else 1
