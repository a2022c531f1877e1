"""Unit tests for rules (``watchd rules test``), in the spirit of ``promtool test rules``.

A test file names the rule files it tests and a list of tests; each test is a timeline of events and the
actions the rules must decide for it::

    rule_files: [../xid.yaml]              # relative to this file
    defaults:                              # attributes added to every event of a kind (optional)
      xid: {pci_bus_id: "0000:3b:00.0"}
    tests:
      - name: Xid 79 drains and requeues
        events:                            # "<at> <node> <kind> key=value ..."
          - 0s gpu-1 xid xid=79 bucket=RESTART_BM meaning="GPU has fallen off the bus"
          - {at: 10m, node: gpu-2, kind: xid, attrs: {xid: 13}}
        expect:                            # exactly the actions decided (unless exhaustive: false)
          - {at: 0s, node: gpu-1, action: drain, params: {reason: "Xid 79 ..."}}
          - {at: 0s, node: gpu-1, action: requeue}
        expect_none:                       # must not be decided at any time
          - {action: drain, node: gpu-2}

``at`` is a duration from the start of the timeline (``0s``, ``90s``, ``10m``, ``1h30m``, ``28d``);
``A..B/S`` repeats an event every S from A to B inclusive. Values are ints, floats, ``true``/``false``,
``null`` or strings; a quoted value (``"..."`` with JSON escapes, or ``'...'``) is always a string.
``source=`` and ``id=`` set the event's source and id instead of an attribute.

Modules: schema (the test file's keys), events (event lines), suite (loading a file), runner (running
its tests), report (a failure's table), results (files and folders run; shown as text, JSON, JUnit XML).
Evaluation is the engine's own (:class:`~watchd.rules.rule_engine.RuleEngine`), driven by the events' times
only.
"""

from watchd.rules.unit_tests.events import parse_event_line
from watchd.rules.unit_tests.report import format_duration
from watchd.rules.unit_tests.results import Results, run_test_files, run_tests
from watchd.rules.unit_tests.runner import ActualAction, CaseOutcome, run_case
from watchd.rules.unit_tests.suite import Suite, load_test_file

__all__ = [
    "ActualAction",
    "CaseOutcome",
    "Results",
    "Suite",
    "format_duration",
    "load_test_file",
    "parse_event_line",
    "run_case",
    "run_test_files",
    "run_tests",
]
