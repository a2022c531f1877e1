"""Issue 16 item 5: the bounds of a template render (watchd/rules/bounds/, docs/rules.md *Templates*):
what is refused at load, what renders ``<template error: ...>`` quickly and without building a large value,
what still works, and the fast path rendering exactly what the interpreter renders."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from tests.rules.rule_helpers import rules_of, xid
from watchd.rules import check_rules, plan
from watchd.rules.context import Context, render_params
from watchd.rules.template import Template, TemplateError

#: Literal bombs: each breaks a bound whatever the event, so it is refused when loaded.
REFUSED_AT_LOAD = {
    "ljust": "{{ 'x'.ljust(2000000000)|length }}",
    "rjust": "{{ 'x'.rjust(20000) }}",
    "center": "{{ 'x'.center(100000000)|length }}",
    "zfill": "{{ '1'.zfill(100000000)|length }}",
    "expandtabs": "{{ '\t'.expandtabs(100000000) }}",
    "to_bytes": "{{ (1).to_bytes(100000000, 'big')|length }}",
    "percent_filter": "{{ '%100000000d'|format(1)|length }}",
    "percent_precision": "{{ '%.100000000f'|format(1.0) }}",
    "percent_operator": "{{ '%100000000d' % 1 }}",
    "str_format": "{{ '{:>100000000}'.format(1)|length }}",
    "center_filter": "{{ 'x'|center(100000000) }}",
    "indent_filter": "{{ 'x'|indent(100000000) }}",
    "batch_filter": "{{ [1]|batch(100000000, 'x')|list }}",
    "set_doubling": "{% set a = 'xxxxxxxxxx' %}" + "{% set a = a ~ a %}" * 20 + "{{ a|length }}",
    "nested_for": "{% for i in 'x'.ljust(10000) %}{% for j in 'x'.ljust(10000) %}{% endfor %}{% endfor %}x",
    "three_loops": "{% for i in 'x' * 100 %}{% for j in 'x' * 100 %}{% for k in 'x' * 100 %}"
    "{% endfor %}{% endfor %}{% endfor %}",
    "big_power": "{{ (((10**100)**100)**100)**100 }}",
    "power": "{{ 2 ** 1000 }}",
    "repeat": "{{ 'x' * 10**9 }}",
}


@pytest.mark.parametrize("name", list(REFUSED_AT_LOAD))
def test_literal_bombs_refused_at_load(name: str) -> None:
    with pytest.raises(TemplateError, match="over the bound"):
        Template(REFUSED_AT_LOAD[name])


def test_rules_check_names_the_file_line_and_bound(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(
        "rules:\n  - name: bomb\n    match: {kind: xid}\n    actions:\n"
        "      - drain: {reason: \"{{ 'x'.ljust(2000000000) }}\"}\n"
    )
    rules, problems = check_rules([path])
    assert rules == []
    assert [str(p) for p in problems] == [
        f"{path}:5:9: rule 'bomb': actions[0] drain: template \"{{{{ 'x'.ljust(2000000000) }}}}\": "
        "ljust() width 2,000,000,000 is over the bound of 10,000"
    ]


#: Bombs whose size is known only at render (``count`` is 1): they load, and render an error quickly.
AT_RENDER = {
    "ljust": ("{{ 'x'.ljust(count * 2000000000)|length }}", "ljust() width"),
    "center": ("{{ 'x'.center(count * 100000000) }}", "center() width"),
    "zfill": ("{{ '1'.zfill(count * 100000000) }}", "zfill() width"),
    "expandtabs": ("{{ ('\t' * 100).expandtabs(count * 1000) }}", "expandtabs() text"),
    "replace": ("{{ ('x' * 10000).replace('x', 'yy' * count) }}", "replace() text"),
    "join": ("{{ ('x' * 5000 * count).join(['a', 'b', 'c']) }}", "join() text"),
    "wordwrap": ("{{ ('w ' * 5000 * count)|wordwrap(1, wrapstring='x' * 100) }}", "wrapped text"),
    "percent": ("{{ '%*d'|format(count * 100000000, 1) }}", "a width"),
    "str_format": ("{{ '{:>{w}}'.format(1, w=count * 100000000) }}", "a format width"),
    "set_doubling": (
        "{% set a = 'xxxxxxxxxx' * count %}" + "{% set a = a ~ a %}" * 20 + "{{ a|length }}",
        "concatenation",
    ),
    "nested_for": (
        "{% for i in 'x'.ljust(count * 10000) %}{% for j in 'x'.ljust(count * 10000) %}"
        "{% endfor %}{% endfor %}x",
        "steps",
    ),
    "big_power": ("{{ (((10**(100 * count))**100)**100)**100 }}", "bits"),
    "repr_of_many": ("{% set t = ('x' * 10000,) * (10000 * count) %}{{ t }}", "output"),
    "upper_of_many": ("{% set t = ('x' * 10000,) * (10000 * count) %}{{ t|upper }}", "|upper"),
    "join_of_many": ("{% set t = ('x' * 10000,) * (10000 * count) %}{{ t|join }}", "|join"),
    "format_of_many": ("{% set t = ('x' * 10000,) * (10000 * count) %}{{ '{!r}'.format(t) }}", "formatted"),
    "written": ("{% set s = 'x' * 10000 * count %}{% for i in s %}{{ s }}{% endfor %}", "wrote more"),
    "macro_fanout": (
        "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(count * 40) }}",
        "steps",
    ),
    "slow_steps": (
        "{% set s = 'x' * 10000 * count %}{% for i in s %}{{ s|list|unique|list|length }}{% endfor %}",
        "CPU time",
    ),
}


@pytest.mark.parametrize("name", list(AT_RENDER))
def test_bombs_sized_at_render_are_bounded_and_quick(name: str) -> None:
    source, reason = AT_RENDER[name]
    template = Template(source)
    tracemalloc.start()
    t0 = time.thread_time()
    try:
        text = template.render({"count": 1})
        elapsed = time.thread_time() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # 10,000 steps take 1-5 ms, more under tracemalloc: the CPU deadline may come first, and bounds as well
    reasons = (reason, "CPU time") if reason == "steps" else (reason,)
    assert text.startswith("<template error: ") and any(r in text for r in reasons), text
    assert len(text) < 300, text
    assert peak < 4 << 20, f"{name}: {peak / 2**20:.1f} MiB at its peak"
    assert elapsed < 0.25, f"{name}: {elapsed:.3f}s"  # tracemalloc slows it several times: generous


def test_templates_within_the_bounds_still_work() -> None:
    ctx = {"xid": 79, "node": "gpu-7", "value": 95.456, "event": {"a": 1, "b": "two"}, "count": 3}
    cases = {
        "{{ '%.1f'|format(value) }} {{ '{:>6.2f}'.format(value) }} {{ '%-5s|' % node }}": (
            "95.5  95.46 gpu-7|"
        ),
        "{% for k, v in event|dictsort %}{{ loop.index }}:{{ k }}={{ v }} {% endfor %}": "1:a=1 2:b=two ",
        "{{ node|upper|replace('GPU', 'g') }} {{ [node, xid]|join('/') }} {{ 'x' * 3 ~ '!' }}": (
            "g-7 gpu-7/79 xxx!"
        ),
        "{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(node) }}{{ m(xid) }}": "<gpu-7><79>",
        "{{ 'ab'.ljust(5, '.') }}{{ '7'.zfill(3) }} {{ 2 ** 10 }} {{ event|tojson }}": (
            'ab...007 1024 {"a": 1, "b": "two"}'
        ),
        "{% set s = 'x' * 100 %}{% for i in s %}{% for j in 'ab' %}{% endfor %}{% endfor %}{{ s|length }}": (
            "100"
        ),
        "{{ 'x'.ljust(10000)|length }} {{ ('y' * 9999 ~ 'z')|length }}": "10000 10000",
        "{{ ('word ' * 200)|wordwrap(20, wrapstring='<br/>')|length }}": "1195",
    }
    for source, expected in cases.items():
        assert Template(source).render(ctx) == expected, source


def test_each_render_has_its_own_budget() -> None:
    """Steps are per render: a template that takes 6,000 steps renders again and again."""
    template = Template("{% for i in 'x' * (count * 3000) %}{{ i }}{% endfor %}")
    for _ in range(5):
        assert template.render({"count": 1}) == "x" * 3000


@pytest.mark.parametrize(
    "reason",
    [
        "{{ 'x' * (count * 6000) ~ 'y' * 6000 }}",
        "{{ 'x'.ljust(count * 2000000000) }}",
        "{{ (((10**(100 * count))**100)**100)**100 }}",
        "{{ node|upper }} {{ 'x' * count }}",
    ],
)
def test_fast_path_renders_what_the_interpreter_renders(reason: str) -> None:
    """The fast path (generated planners) and the interpreter (render_params through the full context) give
    the same text, the bound's error included (bounds of size and steps are deterministic; only a render near
    the CPU deadline may end differently from one run to the next)."""
    (rule,) = rules_of({"name": "r", "match": {"kind": "xid"}, "actions": [{"drain": {"reason": reason}}]})
    event = xid(79, node="gpu-7")
    fast = plan(rule, event).actions[0].params["reason"]
    slow = render_params(rule.templates[0], Context(rule, event, {"node": event.node}, 1))["reason"]
    assert fast == slow
    assert fast.startswith("<template error: ") or fast == "GPU-7 x"


def test_non_utf8_rule_file_is_a_problem_naming_the_file(tmp_path: Path) -> None:
    good = tmp_path / "a.yaml"
    good.write_text("rules:\n  - name: ok\n    match: {kind: xid}\n    actions: [drain]\n")
    bad = tmp_path / "b.yaml"
    bad.write_bytes(b"rules:\n  - name: caf\xe9\n    match: {kind: xid}\n    actions: [drain]\n")
    rules, problems = check_rules([tmp_path])
    assert [r.name for r in rules] == ["ok"]  # the other files are still checked
    assert [str(p) for p in problems] == [f"{bad}:2:14: not UTF-8 text: byte 0xe9 at offset 20"]


def test_dangling_yaml_link_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("rules:\n  - name: ok\n    match: {kind: xid}\n    actions: [drain]\n")
    (tmp_path / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
    _, problems = check_rules([tmp_path])
    assert [str(p) for p in problems] == [
        f"{tmp_path / 'gone.yaml'}:1:1: dangling link to {tmp_path / 'nowhere.yaml'}: "
        "its target does not exist"
    ]
