"""The engine's rules are the embedded default pack plus the site's files: a site rule adds to the defaults,
replaces one only with ``replaces: default``, turns one off with ``disable_defaults``; a same-name rule
without it is a problem naming both files; ``default_rules: false`` runs the site's rules alone."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tests.rules.rule_helpers import xid
from watchd.config import EngineConfig, ReloadConfig
from watchd.engine.runner import Engine
from watchd.errors import ConfigError
from watchd.http_settings import Listen
from watchd.rules import check_rules, effective_rules, load_rules
from watchd.rules.commands import run_check, run_list
from watchd.rules.persist import fingerprint

PACK = [r.name for r in check_rules([])[0]]  # the embedded default pack, counted, never hard-coded

SITE_RULE = """\
rules:
  - name: site-xid-13-page
    match: {kind: xid, xid: 13}
    actions: [{alert: {summary: "Xid 13 on {{ node }}"}}]
"""

OVERRIDE = """\
disable_defaults:
  - xid-45-alone
rules:
  - name: xid-fatal-hardware
    replaces: default
    severity: critical
    match: {kind: xid, xid: 79}
    actions:
      - drain: {reason: "site: Xid {{ xid }}"}
"""


def folder(tmp_path: Path, **files: str) -> Path:
    rules = tmp_path / "rules.d"
    rules.mkdir(exist_ok=True)
    for name, text in files.items():
        (rules / f"{name}.yaml").write_text(text)
    return rules


def test_the_pack_is_not_empty() -> None:
    assert len(PACK) >= 30 and "xid-fatal-hardware" in PACK and "lemon-node" in PACK


def test_one_site_rule_leaves_every_default_active(tmp_path: Path) -> None:
    rules = load_rules([folder(tmp_path, site=SITE_RULE)])
    assert rules.names == [*PACK, "site-xid-13-page"]
    decisions = rules.engine().evaluate(xid(79))
    assert "xid-fatal-hardware" in [d.rule for d in decisions]  # the Xid rules still act
    assert [d.rule for d in rules.engine().evaluate(xid(13))] == ["xid-application", "site-xid-13-page"]


def test_a_named_override_replaces_the_default_and_a_disable_turns_one_off(tmp_path: Path) -> None:
    rules = load_rules([folder(tmp_path, site=OVERRIDE)])
    assert "xid-45-alone" not in rules.names
    assert rules.names.count("xid-fatal-hardware") == 1
    assert len(rules.names) == len(PACK) - 1
    (decision,) = [d for d in rules.engine().evaluate(xid(79)) if d.rule == "xid-fatal-hardware"]
    assert [a.kind for a in decision.actions] == ["drain"]  # the site's: no requeue
    assert decision.actions[0].params["reason"] == "site: Xid 79"
    assert rules.engine().evaluate(xid(45)) == []  # xid-45-alone alone would page


def test_a_same_name_rule_without_replaces_is_a_problem_naming_both_files(tmp_path: Path) -> None:
    site = folder(tmp_path, site=OVERRIDE.replace("    replaces: default\n", ""))
    out = io.StringIO()
    assert run_check([site], out) == 1
    (line, summary) = out.getvalue().splitlines()
    assert line.startswith(f"{site / 'site.yaml'}:4:")
    assert "'xid-fatal-hardware'" in line and "<embedded rules/xid.yaml>:" in line
    assert "replaces: default" in line and summary == f"1 problem in {site}"
    with pytest.raises(ConfigError, match="has the name of the default rule"):
        load_rules([site])
    # without the defaults the name is the site's to use
    assert load_rules([site], defaults=False).names == ["xid-fatal-hardware"]


def test_typos_in_replaces_and_disable_defaults_are_problems(tmp_path: Path) -> None:
    site = folder(
        tmp_path,
        site=OVERRIDE.replace("xid-45-alone", "xid-45-alon").replace(
            "name: xid-fatal-hardware", "name: xid-fatal-hardwar"
        ),
    )
    problems = [str(p) for p in effective_rules([site]).problems]
    assert len(problems) == 2
    assert "no default rule is named 'xid-fatal-hardwar' (did you mean 'xid-fatal-hardware'?)" in problems[0]
    assert problems[1].startswith(f"{site / 'site.yaml'}:2:")
    assert "no default rule is named 'xid-45-alon' (did you mean 'xid-45-alone'?)" in problems[1]


def test_a_default_disabled_and_replaced_is_a_problem(tmp_path: Path) -> None:
    site = folder(tmp_path, site=OVERRIDE.replace("xid-45-alone", "xid-fatal-hardware"))
    (problem,) = effective_rules([site]).problems
    assert "is also replaced" in str(problem)


def test_a_file_that_is_the_pack_itself_is_loaded_once(tmp_path: Path) -> None:
    repo_rules = Path(__file__).parent.parent.parent / "rules"  # links to the embedded pack
    assert load_rules([repo_rules]).names == PACK
    assert load_rules([repo_rules, folder(tmp_path, site=SITE_RULE)]).names == [*PACK, "site-xid-13-page"]
    assert load_rules([repo_rules], defaults=False).names == PACK  # the files, as site files


def test_defaults_off_runs_only_the_site_rules(tmp_path: Path) -> None:
    assert load_rules([folder(tmp_path, site=SITE_RULE)], defaults=False).names == ["site-xid-13-page"]


def test_listing_shows_every_rule_with_its_origin(tmp_path: Path) -> None:
    site = folder(tmp_path, a=OVERRIDE, b=SITE_RULE)
    out = io.StringIO()
    assert run_list([site], out) == 0
    lines = out.getvalue().splitlines()
    rows = {ln.split()[0]: ln for ln in lines[1:-1] if ln.split()[1] != "active" or ln.split()[2] == "site"}
    assert lines[0].split() == ["RULE", "STATE", "ORIGIN", "SOURCE"]
    assert lines[-1] == f"{len(PACK)} active"  # one replaced (still counted once), one disabled, one added
    assert rows["xid-45-alone"].split()[1:3] == ["disabled", "default"]
    assert f"(disabled at {site / 'a.yaml'}:2)" in rows["xid-45-alone"]
    assert f"{site / 'b.yaml'}:2" in rows["site-xid-13-page"]
    replaced = [ln for ln in lines if ln.startswith("xid-fatal-hardware ")]
    assert len(replaced) == 2
    assert replaced[0].split()[1:3] == ["replaced", "default"] and f"at {site / 'a.yaml'}:4" in replaced[0]
    assert replaced[1].split()[1:4] == ["active", "site", f"{site / 'a.yaml'}:4"]

    out = io.StringIO()
    assert run_list([site], out, as_json=True) == 0
    doc = json.loads(out.getvalue())
    assert doc["active"] == len(PACK)
    by_origin = {(r["name"], r["origin"]): r for r in doc["rules"]}
    assert by_origin["lemon-node", "default"]["state"] == "active"
    assert by_origin["lemon-node", "default"]["source"].startswith("<embedded rules/lemon.yaml>:")
    assert by_origin["xid-fatal-hardware", "default"]["by"] == f"{site / 'a.yaml'}:4"
    assert by_origin["site-xid-13-page", "site"]["source"] == f"{site / 'b.yaml'}:2"


def test_listing_a_set_the_engine_would_refuse_exits_1(tmp_path: Path) -> None:
    site = folder(tmp_path, site=OVERRIDE.replace("    replaces: default\n", ""))
    out = io.StringIO()
    assert run_list([site], out) == 1
    assert "has the name of the default rule" in out.getvalue()


def test_replaces_is_no_part_of_the_remembered_definition(tmp_path: Path) -> None:
    """A site rule that replaces a default with the same definition keeps what the default remembered."""
    default = next(r for r in check_rules([])[0] if r.name == "lemon-node")
    text = (Path(__file__).parent.parent.parent / "rules" / "lemon.yaml").read_text()
    site = folder(
        tmp_path,
        lemon=text.replace("  - name: lemon-node\n", "  - name: lemon-node\n    replaces: default\n"),
    )
    replacement = next(r for r in load_rules([site]).rules if r.name == "lemon-node")
    assert replacement.spec.replaces == "default" and replacement.source.startswith(str(site))
    assert fingerprint(replacement) == fingerprint(default)


def test_default_rules_false_needs_rule_files() -> None:
    with pytest.raises(ValueError, match="default_rules: false needs rule files"):
        EngineConfig(default_rules=False)


async def test_the_engine_keeps_the_defaults_beside_a_site_folder(tmp_path: Path) -> None:
    config = EngineConfig(
        listen=Listen(port=0),
        rules=[folder(tmp_path, site=SITE_RULE)],
        reload=ReloadConfig(watch_files=False),
        slurm={"enabled": False},
    )
    async with Engine(config) as engine:
        assert engine.rules.names == [*PACK, "site-xid-13-page"]
        (tmp_path / "rules.d" / "site.yaml").write_text(OVERRIDE)
        assert engine.reload_rules()
        assert "xid-45-alone" not in engine.rules.names and len(engine.rules.names) == len(PACK) - 1


def test_cli_lists_the_set_an_engine_config_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from watchd.cli import main

    site = folder(tmp_path, site=SITE_RULE)
    config = tmp_path / "engine.yaml"
    config.write_text(f"rules: [{site}]\n")
    assert main(["rules", "list", "--config", str(config), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["active"] == len(PACK) + 1
    config.write_text(f"rules: [{site}]\ndefault_rules: false\n")
    assert main(["rules", "list", "--config", str(config)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 active"
    assert main(["rules", "check", "--no-defaults", str(site)]) == 0
    assert capsys.readouterr().out == "ok: 1 rule in 1 file\n"
    assert main(["rules", "list", "--config", str(config), str(site)]) == 2
    assert "not both" in capsys.readouterr().err
