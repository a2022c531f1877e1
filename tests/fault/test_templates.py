"""Issue 16 item 5: template bombs. Each must be refused by ``watchd rules check`` (what can be refused at
load), or bounded at render without blocking the engine's event loop. ``rules check`` runs under a 1 GiB
address-space limit and a 20 s timeout so that a bomb it renders cannot hurt the machine; the runtime checks
use bombs scaled down (50 MB, 25 M loop iterations; ``range`` is not
in the sandbox, a string's characters are) so that today's unbounded render stays cheap."""

from __future__ import annotations

import resource
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import Daemon, watchd_command
from tests.fault.common import post_events, request, start_engine, xid

pytestmark = pytest.mark.real

#: name -> the drain reason template, as the issue reports them.
BOMBS = {
    "ljust_2e9": "{{ 'x'.ljust(2000000000)|length }}",
    "center": "{{ 'x'.center(100000000)|length }}",
    "zfill": "{{ '1'.zfill(100000000)|length }}",
    "percent_format": "{{ '%100000000d'|format(1)|length }}",
    "str_format": "{{ '{:>100000000}'.format(1)|length }}",
    "set_doubling": "{% set a = 'xxxxxxxxxx' %}" + "{% set a = a ~ a %}" * 20 + "{{ a|length }}",
    "nested_for": "{% for i in 'x'.ljust(10000) %}{% for j in 'x'.ljust(10000) %}{% endfor %}{% endfor %}x",
    "big_power": "{{ (((10**100)**100)**100)**100 }}",
}


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize("name", list(BOMBS))
def test_rules_check_refuses_template_bomb(tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        "rules:\n  - name: bomb\n    match: {kind: xid, xid: 13}\n    actions:\n"
        f"      - drain:\n          reason: >-\n            {BOMBS[name]}\n"
    )
    result = subprocess.run(
        [*watchd_command(), "rules", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=20,
        preexec_fn=_limit,
    )
    assert result.returncode == 1, f"accepted: rc={result.returncode} {result.stdout[-300:]}"
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert str(path) in result.stdout + result.stderr


#: Runtime bombs, scaled down: Xid code -> template. Each renders in the drain reason of its own rule. Their
#: sizes are computed at render (``count`` is 1), as the literal forms are refused at load (above) and the
#: engine would not start with them.
RUNTIME = {
    31: "{% for i in 'x'.ljust(count * 5000) %}{% for j in 'x'.ljust(count * 5000) %}"
    "{% endfor %}{% endfor %}x",
    43: "{{ '{:>{w}}'.format(1, w=count * 50000000)|length }}",
    45: "{{ 'x'.ljust(count * 50000000)|length }}",
}


@pytest.fixture(scope="module")
def bomb_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("bombs")
    rules = "rules:\n" + "".join(
        f"  - name: bomb-{code}\n    match: {{kind: xid, xid: {code}}}\n    actions:\n"
        f"      - drain:\n          reason: >-\n            {template}\n"
        for code, template in RUNTIME.items()
    )
    engine = start_engine(tmp, mode="dry-run", rules=rules)
    try:
        yield engine
    finally:
        engine.stop()


def _hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


@pytest.mark.parametrize("code", list(RUNTIME))
def test_template_bomb_bounded_at_render_without_blocking(bomb_engine: Daemon, code: int) -> None:
    # reset the peak RSS to the current RSS (Linux >= 4.0), so an earlier bomb's peak cannot hide this one
    Path(f"/proc/{bomb_engine.proc.pid}/clear_refs").write_text("5")
    hwm_before = _hwm_kib(bomb_engine.proc.pid)
    sender = threading.Thread(
        target=post_events, args=(bomb_engine, [xid(f"bomb-{code}", code=code)], 30), daemon=True
    )
    sender.start()
    worst = 0.0
    end = time.monotonic() + 2.5
    while time.monotonic() < end:
        t0 = time.monotonic()
        request(bomb_engine.url, "GET", "/healthz", timeout=30)
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.02)
    sender.join(30)
    grown = (_hwm_kib(bomb_engine.proc.pid) - hwm_before) / 1024
    assert worst < 0.5, f"the event loop was blocked {worst:.2f}s by one render"
    assert grown < 32, f"one render raised the peak RSS by {grown:.0f} MiB"
