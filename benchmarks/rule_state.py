"""What saving and restoring the rules' memory costs (watchd/rules/persist.py, state.rules_snapshot_s).

An engine with the default pack + 1,000 synthetic rules is primed with one event per GPU of 10,000 and
100,000 GPUs (benchmarks/common.py), then: the copy taken on the event loop (``RuleEngine.snapshot``), the
encoding done in a thread (``state_to_data`` + ``json.dumps``), and the restore at start
(``json.loads`` + ``RuleEngine.restore``). Floors, same run: a shallow ``dict()`` of every table (the least
any copy costs) and ``json.dumps`` of the already-converted data (the C encoder alone).
Run: ``.venv/bin/python benchmarks/rule_state.py``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import make_events, synthetic_rules_yaml, table  # noqa: E402
from watchd.rules import RuleSet, load_rules, parse_rule_file  # noqa: E402
from watchd.rules.persist import state_to_data  # noqa: E402


def main() -> int:
    pack = load_rules([ROOT / "rules"])
    synthetic, problems = parse_rule_file(synthetic_rules_yaml(1000), "<synthetic>", len(pack.rules))
    if problems:
        raise SystemExit("\n".join(str(p) for p in problems))
    rules = RuleSet((*pack.rules, *synthetic))
    body = []
    for gpus in (10_000, 100_000):
        engine = rules.engine()
        for event in make_events(gpus, gpus=gpus, seed=3, every_gpu=True):
            engine.evaluate(event)
        states = engine._state.values()  # the floor copies the very tables
        t0 = time.perf_counter()
        for st in states:
            dict(st.window), dict(st.held_since), set(st.fired_hold)
            dict(st.unless_seen), dict(st.last_fired)
        floor_copy = time.perf_counter() - t0
        t0 = time.perf_counter()
        snapshot = engine.snapshot()
        copy_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        data = {rule: (fp, state_to_data(c)) for rule, (fp, c) in snapshot.items()}
        encoded = {rule: (fp, json.dumps(d, separators=(",", ":"))) for rule, (fp, d) in data.items()}
        encode_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _, d in data.values():
            json.dumps(d, separators=(",", ":"))
        floor_encode = time.perf_counter() - t0
        size = sum(len(text) for _, text in encoded.values())
        fresh = rules.engine()
        t0 = time.perf_counter()
        restored, skipped = fresh.restore({r: (fp, json.loads(text)) for r, (fp, text) in encoded.items()})
        restore_s = time.perf_counter() - t0
        assert not skipped and fresh.tracked_groups == engine.tracked_groups
        body.append(
            [
                f"{engine.tracked_groups:,}",
                f"{len(restored):,}",
                f"{copy_s * 1e3:,.0f} ({copy_s / floor_copy:.1f}x)",
                f"{encode_s * 1e3:,.0f} ({encode_s / floor_encode:.1f}x)",
                f"{size / 2**20:.1f}",
                f"{restore_s * 1e3:,.0f}",
                f"{copy_s / engine.tracked_groups * 1e6:.2f}",
            ]
        )
    print("\nwatchd rule state: pack + 1,000 synthetic rules, one event per GPU")
    heads = ["groups", "rules", "loop copy ms (vs dict())", "encode ms (vs json)", "MiB", "restore ms"]
    print(table([*heads, "copy us/group"], body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
