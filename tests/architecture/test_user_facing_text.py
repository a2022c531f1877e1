"""What users read speaks to them: no internal tracker numbers ("issue 17", "issue 22 item 3") in the code,
the shipped rules, the benchmarks or the docs, where they mean nothing to a site's SRE."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
TREES = ("watchd", "rules", "benchmarks", "docs")
TRACKER_NUMBER = re.compile(r"\b[Ii]ssues? ?#?\d+\b|\(#\d+\)")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".json", ".txt", ".toml", ".sh", ".j2", ".html", ".cfg"}


def _text_files() -> list[Path]:
    out = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES:
                out.append(path)
    return out


def test_the_pattern_finds_what_it_is_for() -> None:
    for text in ("(issue 17)", "Issue 16's goal", "issue 22 item 3", "see issues 17", "(#41)"):
        assert TRACKER_NUMBER.search(text), text
    for text in ("an issue with the GPU", "Xid 79", "0x8 reasons", "color: #222"):
        assert not TRACKER_NUMBER.search(text), text


def test_no_internal_issue_numbers_in_what_users_read() -> None:
    files = _text_files()
    assert len(files) > 100  # the trees are where they are said to be
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}"
        for path in files
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if TRACKER_NUMBER.search(line)
    ]
    assert not found, "internal issue numbers:\n" + "\n".join(found)
