"""The ``shortlist`` template filter: a long list of nodes named by its first few and a count."""

from __future__ import annotations

from watchd.rules.template import Template
from watchd.shortlist import shortlist


def test_short_lists_are_whole_and_long_ones_say_how_many_more() -> None:
    assert shortlist("gpu-1,gpu-2") == "gpu-1, gpu-2"
    assert shortlist("a,b,c,d", 2) == "a, b and 2 more"
    assert shortlist(["a", "b", "c"], 3) == "a, b, c"
    assert shortlist("", 3) == ""
    assert shortlist(7) == "7"
    assert shortlist("a,b", 0) == "a and 1 more"  # at least one is shown


def test_a_two_thousand_node_hang_alert_stays_short() -> None:
    suspects = ",".join(f"gpu-{i}" for i in range(2000))
    text = Template("suspects {{ suspects | shortlist(3) }}").render({"suspects": suspects})
    assert text == "suspects gpu-0, gpu-1, gpu-2 and 1997 more"
