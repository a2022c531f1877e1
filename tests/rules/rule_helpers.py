"""Events and rules for the rule tests."""

from __future__ import annotations

from typing import Any

import yaml

from watchd.model.events import Event
from watchd.rules import parse_rule_file
from watchd.rules.rule import Rule


def xid(n: int, node: str = "gpu-1", t: float = 0.0, eid: str | None = None, **attrs: Any) -> Event:
    base: dict[str, Any] = {"xid": n, "pci_bus_id": "0000:3b:00.0", "meaning": "GPU has fallen off the bus"}
    base.update(attrs)
    return Event(id=eid or f"e{n}-{t}-{node}", node=node, source="kmsg", kind="xid", time=t, attrs=base)


def rules_of(*specs: dict[str, Any], first_order: int = 0) -> tuple[Rule, ...]:
    rules, problems = parse_rule_file(yaml.safe_dump({"rules": list(specs)}), "t.yaml", first_order)
    assert not problems, [str(p) for p in problems]
    return tuple(rules)
