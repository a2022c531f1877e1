"""``watchd completion bash|zsh``: the script, generated from the command line's own grammar, loaded into a
real bash (``complete -p``, the completion function as bash calls it) and a real zsh (``bashcompinit``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import real_components_required
from watchd.cli_parser import parser
from watchd.completion import grammar, script

# the completion function called as bash calls it, for the words given; prints COMPREPLY one per line
BASH_CALL = """
source "$1"
shift
COMP_WORDS=("$@")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
_watchd
printf '%s\\n' "${COMPREPLY[@]}"
"""


def bash(script_file: Path, *words: str, cwd: Path | None = None) -> list[str]:
    res = subprocess.run(
        ["bash", "--norc", "-c", BASH_CALL, "bash", str(script_file), "watchd", *words],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        cwd=cwd,
    )
    assert res.stderr == "", res.stderr
    return sorted(line for line in res.stdout.splitlines() if line)


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "watchd.bash"
    path.write_text(script("bash", parser()))
    return path


def test_bash_registers_the_completion(bash_script: Path) -> None:
    res = subprocess.run(
        ["bash", "--norc", "-c", f'eval "$(cat {bash_script})"; complete -p watchd'],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert res.stdout.strip() == "complete -F _watchd watchd" and res.stderr == ""


def test_bash_completes_commands_verbs_options_and_values(bash_script: Path, tmp_path: Path) -> None:
    commands = sorted(grammar(parser()).subcommands["watchd"])
    assert "status" in commands and "completion" in commands
    assert bash(bash_script, "") == commands
    assert bash(bash_script, "re") == ["reliability", "report"]
    assert bash(bash_script, "node", "") == ["history", "marks", "resume", "unmark", "validate"]
    assert bash(bash_script, "actions", "") == ["discard", "list", "release"]
    assert bash(bash_script, "actions", "--to") == ["--token-file"]
    assert bash(bash_script, "status", "--url", "http://x", "--j") == ["--json"]
    assert bash(bash_script, "drains", "--owner", "") == ["admin", "nhc", "other", "scheduler", "watchd"]
    assert bash(bash_script, "report", "usage", "--format", "c") == ["csv"]
    assert bash(bash_script, "completion", "") == ["bash", "zsh"]
    assert bash(bash_script, "rules", "test", "--junit", "out.xml", "--js") == ["--json"]
    # a value that is free text gets nothing; a file name gets files
    assert bash(bash_script, "status", "--url", "") == []
    (tmp_path / "engine.yaml").write_text("")
    (tmp_path / "other.txt").write_text("")
    assert bash(bash_script, "status", "--config", "eng", cwd=tmp_path) == ["engine.yaml"]
    assert bash(bash_script, "rules", "check", "e", cwd=tmp_path) == ["engine.yaml"]
    # an option's value does not count as a subcommand
    assert bash(bash_script, "checks", "--by", "node", "") == ["history", "list", "plan", "run"]


def test_every_operator_command_offers_the_ways_to_reach_the_engine() -> None:
    g = grammar(parser())
    for path in (
        "watchd status",
        "watchd drains",
        "watchd reliability",
        "watchd actions",
        "watchd checks",
        "watchd node resume",
        "watchd node validate",
        "watchd node history",
    ):
        for option in ("--url", "--token-file", "--config", "--ca-file", "--insecure", "--json"):
            assert option in g.options[path], (path, option)


def test_zsh_loads_the_same_script_through_bashcompinit(tmp_path: Path) -> None:
    if shutil.which("zsh") is None:
        if real_components_required():
            pytest.fail("zsh required under CI (apt-get install zsh)")
        pytest.skip("zsh not installed")
    path = tmp_path / "watchd.zsh"
    path.write_text(script("zsh", parser()))
    # zsh filters the candidates itself (compadd, by the word's prefix): compgen gives them all
    call = (
        f"source {path} || exit 9; print -r -- comps=$_comps[watchd]; "
        't() { emulate -L sh; setopt kshglob noshglob braceexpand; COMP_WORDS=("$@"); '
        'COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); _watchd; print -r -- "${COMPREPLY[*]}"; }; '
        't watchd node ""; t watchd report usage --format ""; t watchd actions -'
    )
    res = subprocess.run(["zsh", "-f", "-c", call], capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "comps=_bash_complete -F _watchd"
    assert lines[1].split() == ["resume", "validate", "unmark", "marks", "history"]
    assert lines[2].split() == ["table", "csv", "json", "markdown", "html", "prometheus"]
    assert "--token-file" in lines[3].split() and "list" not in lines[3].split()


def test_the_command_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    from watchd.cli import main

    assert main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == script("bash", parser())
    with pytest.raises(SystemExit) as usage:
        main(["completion", "fish"])
    assert usage.value.code == 2
