"""Shell completion generated from the command line's own grammar (the argparse tree of
:mod:`watchd.cli_parser`), so it can never drift from it: ``watchd completion bash|zsh`` prints a script.

The script is plain bash (4.2 or later); zsh runs the same script through its ``bashcompinit``. It completes
commands and subcommands, options (after ``-``), the values of options with choices, file names where an
option or argument names a file, and verbs such as ``actions list|release|discard``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Grammar", "grammar", "script"]

FILE = "@file"  # the value is a file name
FREE = "@free"  # the value is free text: nothing to offer


@dataclass
class Grammar:
    """What to offer at each command path (``watchd``, ``watchd node``, ``watchd node resume``, ...)."""

    subcommands: dict[str, list[str]] = field(default_factory=dict)
    options: dict[str, list[str]] = field(default_factory=dict)
    values: dict[tuple[str, str], str] = field(default_factory=dict)  # (path, option) -> FILE, FREE, choices
    words: dict[str, list[str]] = field(default_factory=dict)  # positional choices (verbs)
    files: set[str] = field(default_factory=set)  # paths whose positional arguments are files


def _names_files(action: argparse.Action) -> bool:
    return action.type is Path or bool(getattr(action, "completes_files", False))


def grammar(parser: argparse.ArgumentParser) -> Grammar:
    found = Grammar()
    _walk(parser, "watchd", found)
    return found


def _walk(parser: argparse.ArgumentParser, path: str, found: Grammar) -> None:
    options: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.subcommands[path] = list(action.choices)
            for name, child in action.choices.items():
                _walk(child, f"{path} {name}", found)
        elif action.option_strings:
            options.extend(action.option_strings)
            if action.nargs == 0:
                continue
            if action.choices is not None:
                value = " ".join(str(c) for c in action.choices)
            else:
                value = FILE if _names_files(action) else FREE
            for option in action.option_strings:
                found.values[path, option] = value
        elif action.choices is not None:
            found.words.setdefault(path, []).extend(str(c) for c in action.choices)
        elif _names_files(action):
            found.files.add(path)
    found.options[path] = options


def _q(text: str) -> str:
    """A bash word in double quotes (the grammar's words have no quote, dollar or backslash)."""
    assert not any(c in text for c in '"$`\\'), text
    return f'"{text}"'


def _table(name: str, rows: dict[str, str]) -> str:
    body = "\n".join(f"    [{_q(k)}]={_q(v)}" for k, v in sorted(rows.items()))
    return f"declare -gA {name}=(\n{body}\n)"


_FUNCTION = r"""
_watchd() {
    local cur="${COMP_WORDS[COMP_CWORD]}" path="watchd" word key i
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${COMP_WORDS[i]}"
        key="$path|$word"
        if [[ -n "${_watchd_values[$key]+x}" ]]; then
            ((i++))
            continue
        fi
        if [[ " ${_watchd_subcommands[$path]} " == *" $word "* ]]; then
            path="$path $word"
        fi
    done
    COMPREPLY=()
    if ((COMP_CWORD > 1)); then
        key="$path|${COMP_WORDS[COMP_CWORD - 1]}"
        if [[ -n "${_watchd_values[$key]+x}" ]]; then
            case "${_watchd_values[$key]}" in
            @file) _watchd_files "$cur" ;;
            @free) ;;
            *) COMPREPLY=($(compgen -W "${_watchd_values[$key]}" -- "$cur")) ;;
            esac
            return 0
        fi
    fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "${_watchd_options[$path]}" -- "$cur"))
        return 0
    fi
    COMPREPLY=($(compgen -W "${_watchd_subcommands[$path]} ${_watchd_words[$path]}" -- "$cur"))
    if [[ -n "${_watchd_files[$path]+x}" ]]; then
        _watchd_files "$cur"
    fi
    return 0
}

_watchd_files() {
    local IFS=$'\n'
    COMPREPLY+=($(compgen -f -- "$1"))
    if type compopt >/dev/null 2>&1; then
        compopt -o filenames 2>/dev/null
    fi
}

complete -F _watchd watchd
"""


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (bash or zsh)."""
    g = grammar(parser)
    tables = "\n".join(
        [
            _table("_watchd_subcommands", {k: " ".join(v) for k, v in g.subcommands.items()}),
            _table("_watchd_options", {k: " ".join(v) for k, v in g.options.items()}),
            _table("_watchd_values", {f"{p}|{o}": v for (p, o), v in g.values.items()}),
            _table("_watchd_words", {k: " ".join(v) for k, v in g.words.items()}),
            _table("_watchd_files", {k: "1" for k in g.files}),
        ]
    )
    head = "# watchd completion for bash (4.2 or later), generated by `watchd completion bash`\n"
    if shell == "zsh":
        head = (
            "# watchd completion for zsh, generated by `watchd completion zsh`: the bash script run through\n"
            '# zsh\'s bashcompinit. In ~/.zshrc, after compinit: eval "$(watchd completion zsh)"\n'
            "autoload -U +X compinit && { (( ${+_comps} )) || compinit; }\n"
            "autoload -U +X bashcompinit && bashcompinit\n"
        )
    return head + tables + "\n" + _FUNCTION.lstrip("\n")
