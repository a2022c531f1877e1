"""The shipped Grafana dashboard, offline: valid against the dashboard schema (tests/data/grafana), laid out
on Grafana's 24-column grid without overlaps, with the $datasource/$cluster/$job variables every query
uses, a unit on every panel (seconds on the latency panels), the rows an operator looks for, and every query
valid PromQL (promtool). That every query returns data from a real Prometheus scraping real daemons:
test_stack.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.monitoring.dashboard import ACCOUNTING, SCHEMA, expand, load, panels, queries

ROWS = (
    "Overview",
    "Events, decisions and latency",
    "Drains and partition availability",
    "GPU health",
    "Checks",
    "Reliability",
    "Leader, store and the daemons",
)


def test_the_dashboard_is_valid_against_the_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA.read_text()))
    jsonschema.validate(load(), json.loads(SCHEMA.read_text()), cls=jsonschema.Draft202012Validator)


def test_the_schema_catches_a_broken_dashboard() -> None:
    schema = json.loads(SCHEMA.read_text())
    for breakage in (
        lambda d: d["panels"][1]["gridPos"].pop("h"),
        lambda d: d["panels"][1]["targets"][0].update(refId="a1"),
        lambda d: d["panels"][1].update(type="graphh"),
        lambda d: d["templating"]["list"][1].pop("datasource"),
        lambda d: d.update(schemaVersion="39"),
    ):
        dash = load()
        breakage(dash)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(dash, schema, cls=jsonschema.Draft202012Validator)


def test_layout_ids_and_rows() -> None:
    dash = load()
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
    titles = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    for row in ROWS:
        assert row in titles
    for p in panels(dash):
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), p["title"]


def test_variables_and_what_every_query_selects() -> None:
    dash = load()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert set(variables) == {"datasource", "cluster", "job"}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for name in ("cluster", "job"):
        v = variables[name]
        assert v["includeAll"] and v["multi"] and v["allValue"] == ".*", name
        assert "watchd_build_info" in v["query"]["query"], name
    for p in panels(dash):
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']}: no unit"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            # every selector of a metric is scoped to the chosen cluster and jobs; no job name is hard-coded
            for selector in re.findall(r"\b(?:watchd_|process_|up\b)[\w]*\{[^}]*\}", t["expr"]):
                assert 'cluster=~"$cluster"' in selector and 'job=~"$job"' in selector, (p["title"], selector)
            assert "watchd/watchd-" not in t["expr"] and 'job="' not in t["expr"], p["title"]
            bare = re.sub(r"\{[^}]*\}", "{}", t["expr"])
            for name in re.findall(r"\b((?:watchd_|process_)\w+)(?!\w|\{|\()", bare):
                pytest.fail(f"{p['title']}: {name} without the $cluster/$job selector")
        latency = "latency" in p["title"].lower() or any("_seconds_bucket" in t["expr"] for t in p["targets"])
        if latency:
            assert p["fieldConfig"]["defaults"]["unit"] == "s", p["title"]


def test_every_query_is_valid_promql(tmp_path: Path, promtool: str) -> None:
    values = {"cluster": "(c1|c2)", "job": "(watchd-engine|watchd-agent)", "datasource": "prom"}
    exprs = [expand(q.expr, values) for q in queries()]
    assert len(exprs) >= 50
    rules = {
        "groups": [
            {"name": "panels", "rules": [{"record": f"panel:q{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    f = tmp_path / "panels.yaml"
    f.write_text(yaml.safe_dump(rules))
    res = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sum(ACCOUNTING in e for e in exprs) >= 8
