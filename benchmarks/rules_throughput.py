"""Rule evaluation throughput: events/second through ``RuleEngine.evaluate`` on one core, no I/O.

Rule sets: the default rule pack (rules/, or the embedded defaults when rules/ does not load) alone and with
100 / 1,000 / 5,000 synthetic rules (benchmarks/common.py: mostly kind + one pinned field, some regex and
numeric operators, ~10% stateful). Events: a time-ordered stream of Xid and gpu_health events over 1,000
nodes x 8 GPUs (and over 100 / 10,000 / 100,000 GPUs for the tracked-groups rows). Every figure is the best
of --repeat passes, each on a fresh engine built outside the timing (its build time is a column of its own),
after a warm-up pass and a full garbage collection; the floor is a loop that only reads ``event.kind``. Memory
is measured in a separate pass under tracemalloc (what the engine holds afterwards).
Run: ``.venv/bin/python benchmarks/rules_throughput.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import make_events, max_rss_mib, rate, synthetic_rules_yaml, table  # noqa: E402
from watchd.errors import ConfigError  # noqa: E402
from watchd.model.events import Event  # noqa: E402
from watchd.rules import RuleEngine, RuleSet, load_rules, parse_rule_file  # noqa: E402
from watchd.rules.rule import Rule  # noqa: E402

TARGET = 50_000  # events/s with the pack + 1,000 synthetic rules
TARGET_ROW = "pack + 1,000 synthetic"
#: What timed passes read: wall time, or with --cpu this process's CPU time (steadier on a shared machine).
CLOCK = time.perf_counter


@dataclass
class Row:
    name: str
    rules: int
    events: int
    seconds: float
    decisions: int = 0
    groups: int | None = None
    state_mib: float | None = None
    evicted: int | None = None
    groups_after: int | None = None
    build_s: float | None = None


def floor_pass(events: list[Event]) -> int:
    n = 0
    for event in events:
        if event.kind:
            n += 1
    return n


def floor_seconds(events: list[Event], repeat: int) -> float:
    """The best of ``repeat`` floor passes, on ``CLOCK``."""
    best = float("inf")
    for _ in range(repeat):
        t0 = CLOCK()
        floor_pass(events)
        best = min(best, CLOCK() - t0)
    return best


def evaluate_pass(engine: RuleEngine, events: list[Event]) -> int:
    """The number of decisions ``engine`` makes over the stream."""
    evaluate = engine.evaluate
    decisions = 0
    for event in events:
        decisions += len(evaluate(event))
    return decisions


def measure(name: str, ruleset: RuleSet, events: list[Event], repeat: int, budget_s: float) -> Row:
    """Best of ``repeat`` passes, each on a fresh engine built outside the timing (its best build time is
    reported apart), after a full collection, so that a pass does not pay for collecting what the set-up
    allocated (a long-running engine has done so long before). A pass covers the stream, or as much of its
    start as ``budget_s`` allows at the rate the warm-up pass showed (the table says how many events)."""
    warm = events[: min(len(events), 10_000)]
    gc.collect()
    t0 = CLOCK()
    evaluate_pass(ruleset.engine(), warm)  # warm-up, and the rate estimate
    per_event = (CLOCK() - t0) / len(warm)
    events = events[: max(len(warm), min(len(events), int(budget_s / per_event)))]
    best = build = float("inf")
    decisions = 0
    for _ in range(repeat):
        t0 = CLOCK()
        engine = ruleset.engine()
        t1 = CLOCK()
        gc.collect()
        t2 = CLOCK()
        decisions = evaluate_pass(engine, events)
        t3 = CLOCK()
        build, best = min(build, t1 - t0), min(best, t3 - t2)
    row = Row(name, len(ruleset.rules), len(events), best, decisions, build_s=build)
    row.groups, row.evicted = engine.tracked_groups, engine.groups_evicted
    print(f"  ... {name}: {len(events) / best:,.0f} events/s", file=sys.stderr, flush=True)
    return row


def measure_groups(ruleset: RuleSet, gpus: int, chunk: int, repeat: int) -> Row:
    """One engine primed with one event for every GPU of ``gpus`` (under tracemalloc: what the engine holds
    afterwards is its group state), then a warm-up chunk and ``repeat`` timed chunks of the same stream,
    continuing in time; the best chunk counts."""
    stream = make_events(gpus + (repeat + 1) * chunk, gpus=gpus, seed=3, every_gpu=True)
    prime, rest = stream[:gpus], stream[gpus:]
    engine = ruleset.engine()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for event in prime:
        engine.evaluate(event)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    groups = engine.tracked_groups
    evaluate = engine.evaluate

    def run(part: list[Event]) -> int:
        return sum(len(evaluate(e)) for e in part)

    run(rest[:chunk])
    best, decisions = float("inf"), 0
    for i in range(1, repeat + 1):
        part = rest[i * chunk : (i + 1) * chunk]
        gc.collect()
        t0 = CLOCK()
        got = run(part)
        if (took := CLOCK() - t0) < best:
            best, decisions = took, got
    row = Row(f"{gpus:,} GPUs primed", len(ruleset.rules), chunk, best, decisions, groups, held / 2**20)
    row.evicted = engine.groups_evicted
    row.groups_after = engine.tracked_groups
    print(
        f"  ... groups {gpus:,}: {chunk / best:,.0f} events/s, {groups:,} groups", file=sys.stderr, flush=True
    )
    return row


def load_pack() -> tuple[RuleSet, str]:
    try:
        return load_rules([ROOT / "rules"]), "rules/"
    except ConfigError as exc:
        first = str(exc).splitlines()[0]
        print(f"NOTE: rules/ does not load ({first} ...); using the embedded defaults instead")
        return load_rules([]), "embedded defaults (rules/ did not load)"


def profile(ruleset: RuleSet, events: list[Event], top: int) -> str:
    prof = cProfile.Profile()
    engine = ruleset.engine()
    prof.enable()
    evaluate_pass(engine, events)
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)
    text = out.getvalue()
    return text[text.find("   ncalls") :]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--synthetic", type=int, nargs="+", default=[100, 1000, 5000])
    p.add_argument("--groups", type=int, nargs="+", default=[100, 10_000, 100_000], help="GPUs primed")
    p.add_argument("--chunk", type=int, default=20_000, help="events per timed chunk in the groups rows")
    p.add_argument("--budget", type=float, default=3.0, help="seconds a timed pass may take (caps events)")
    p.add_argument("--profile", action="store_true", help="profile pack + 1,000 even when the target is met")
    p.add_argument("--cpu", action="store_true", help="time passes in CPU time, not wall time")
    args = p.parse_args()
    if args.cpu:
        global CLOCK
        CLOCK = time.process_time

    pack, pack_from = load_pack()
    t0 = time.perf_counter()
    most = max(args.synthetic)
    synthetic, problems = parse_rule_file(synthetic_rules_yaml(most), "<synthetic>", len(pack.rules))
    parse_s = time.perf_counter() - t0
    if problems:
        raise SystemExit("\n".join(str(x) for x in problems))
    t0 = time.perf_counter()
    events = make_events(args.events)
    gen_s = time.perf_counter() - t0
    kinds = {k: sum(1 for e in events if e.kind == k) for k in ("xid", "gpu_health")}

    def with_synthetic(n: int) -> RuleSet:
        return RuleSet(tuple[Rule, ...]((*pack.rules, *synthetic[:n])))

    rows: list[Row] = []
    seconds = floor_seconds(events, args.repeat)
    rows.append(Row("floor: iterate, read event.kind", 0, len(events), seconds))
    rows.append(measure("default pack", pack, events, args.repeat, args.budget))
    for n in sorted(args.synthetic):
        rows.append(measure(f"pack + {n:,} synthetic", with_synthetic(n), events, args.repeat, args.budget))
    mid = with_synthetic(1000)
    group_rows = [measure_groups(mid, gpus, args.chunk, args.repeat) for gpus in args.groups]

    floor = rows[0].seconds
    print(
        f"\nwatchd rule evaluation, one core ({os.cpu_count()} shared cores; best of {args.repeat}, "
        f"after a warm-up; {'CPU' if args.cpu else 'wall'} time), Python {sys.version.split()[0]}"
    )
    print(
        f"  pack: {len(pack.rules)} rules from {pack_from}; {most:,} synthetic rules parsed in "
        f"{parse_s:.1f} s ({most / parse_s:,.0f} rules/s)"
    )
    print(
        f"  events: {len(events):,} ({kinds['xid']:,} xid, {kinds['gpu_health']:,} gpu_health), "
        f"1,000 nodes x 8 GPUs, generated in {gen_s:.1f} s\n"
    )
    body = []
    for r in rows:
        body.append(
            [
                r.name,
                f"{r.rules:,}",
                f"{r.events:,}",
                rate(r.events, r.seconds),
                f"{r.seconds / r.events * 1e6:.2f}",
                "-" if r is rows[0] else f"{r.seconds / r.events / (floor / rows[0].events):,.0f}x",
                "-" if r is rows[0] else f"{r.decisions / r.events:.2f}",
                "-" if r.groups is None else f"{r.groups:,}",
                "-" if r.build_s is None else f"{r.build_s * 1e3:,.0f}",
            ]
        )
    heads = ["rule set", "rules", "events", "events/s", "us/event", "vs floor", "decisions/ev", "groups"]
    heads.append("build ms")
    print(table(heads, body))
    print(
        f"\n  tracked groups: pack + 1,000 synthetic, one event per GPU first, "
        f"then {args.chunk:,}-event chunks"
    )
    body = []
    for r in group_rows:
        body.append(
            [
                r.name,
                f"{r.groups or 0:,}",
                f"{r.state_mib or 0:.1f}",
                f"{(r.state_mib or 0) * 2**20 / max(1, r.groups or 0):,.0f}",
                rate(r.events, r.seconds),
                f"{r.seconds / r.events * 1e6:.2f}",
                f"{r.decisions / r.events:.2f}",
                f"{r.groups_after or 0:,}",
                f"{r.evicted or 0:,}",
            ]
        )
    heads = ["primed", "groups", "state MiB", "B/group", "events/s", "us/event", "decisions/ev", "groups end"]
    print(table([*heads, "evicted"], body))
    target_row = next((r for r in rows if r.name == TARGET_ROW), None)
    missed = False
    if target_row is not None:
        got = target_row.events / target_row.seconds
        missed = got < TARGET
        print(
            f"\n  target: >= {TARGET:,} events/s with pack + 1,000 rules: {got:,.0f} -> "
            f"{'MISSED' if missed else 'met'} ({got / TARGET:.2f}x target)"
        )
    print(f"  max RSS of this process: {max_rss_mib():,.0f} MiB")
    if missed or args.profile:
        print("\n  cProfile, pack + 1,000 synthetic, first 50,000 events (tottime):")
        print(profile(mid, events[:50_000], 18))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
