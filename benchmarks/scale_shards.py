"""Several shards at once (docs/scale.md, "Beyond one engine: shards"): scale_100k.py's options, and
``--shards K``:

    python benchmarks/scale_shards.py --shards 2 --nodes 2000   # two engines, 1,000 agents each

One private PostgreSQL server; K ``watchd engine`` processes, each with its own database on it and its own
lease (``shard-1`` .. ``shard-K``, leader election enabled), each owning a disjoint slice of the ``--nodes``
node names (its in-memory scheduler lists only those); one load generator per shard (its own processes)
pointed at its shard's engine. Every engine must lead its own lease before anything is sent (its /readyz
says ``leader`` and its database's lease row names it, unexpired), all of them at once.

The phases of scale_100k.py per shard, the shards' run at the same time: the idle phases together, then the
generators started together (one measured span) with each shard's Xid injections to its own nodes. Reported:
each shard's figures (the per-store summary) and the totals (CPU and RSS summed, events/s summed, anything
dropped anywhere, any generator behind), the load average over the span, and isolation: each shard's audit
trail (its database's ``audit`` table) holds no record of another shard's injected Xids and no node outside
its slice.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.loadgen import Plan, Run, node_name
from benchmarks.scale_100k import (
    TOKEN,
    arguments,
    idle_phase,
    leads,
    load_phase,
    prepare,
    print_summary,
    start_engine,
    summarize,
)
from tests.daemons import Daemon
from tests.harness.postgres import PostgresServer


def slices(nodes: int, k: int) -> list[tuple[int, int]]:
    """(first, count) of each shard: ``nodes`` split evenly, the remainder to the first shards."""
    base, extra = divmod(nodes, k)
    out, first = [], 0
    for i in range(k):
        count = base + (1 if i < extra else 0)
        out.append((first, count))
        first += count
    return out


def _rows(pg: PostgresServer, db: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg.dsn_with_password(db), autocommit=True) as conn:
        return list(conn.execute(sql).fetchall())


def lease_rows(pg: PostgresServer, db: str) -> list[tuple[str, str, float]]:
    """The database's lease rows: (name, holder, seconds until it expires)."""
    return [
        (name, holder, expires - time.time())
        for name, holder, expires in _rows(pg, db, "SELECT name, holder, expires_at FROM leader_lease")
    ]


def _together(work: list[Callable[[], Any]]) -> list[Any]:
    """Run each callable in its own thread at once; their results in order (the first error raised)."""
    out: list[Any] = [None] * len(work)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            out[i] = work[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


class Shard:
    def __init__(self, index: int, first: int, count: int, db: str, work: Path) -> None:
        self.index, self.first, self.count, self.db, self.work = index, first, count, db, work
        self.lease = f"shard-{index}"
        self.engine: Daemon | None = None

    @property
    def live(self) -> Daemon:
        assert self.engine is not None
        return self.engine

    @property
    def nodes(self) -> set[str]:
        return {node_name(i) for i in range(self.first, self.first + self.count)}


def check_leaders(pg: PostgresServer, shards: list[Shard]) -> list[str]:
    """Each engine leads its own lease at this moment; what is wrong, if anything."""
    wrong = []
    for s in shards:
        assert s.engine is not None
        rows = lease_rows(pg, s.db)
        if not leads(s.engine.url):
            wrong.append(f"{s.lease}: the engine is not ready as the leader")
        held = [(name, holder) for name, holder, left in rows if left > 0]
        if len(rows) != 1 or held != [(s.lease, f"{s.lease}-engine")]:
            wrong.append(f"{s.lease}: lease rows {rows}")
    return wrong


def isolation(pg: PostgresServer, shards: list[Shard], sent: list[set[str]]) -> list[str]:
    """Per shard: its audit records of other shards' injected Xids, and of nodes outside its slice."""
    lines = []
    for s, own in zip(shards, sent, strict=True):
        audit = _rows(pg, s.db, "SELECT event_id, node, action FROM audit")
        others = set().union(*(x for x in sent if x is not own))
        foreign_events = sum(1 for event_id, _, _ in audit if event_id in others)
        foreign_nodes = sum(1 for _, node, _ in audit if node not in s.nodes)
        own_drains = sum(1 for event_id, _, action in audit if action == "drain" and event_id in own)
        lines.append(
            f"{s.lease}: {own_drains} drains of its {len(own)} injected Xids in its audit; records of the "
            f"other shards' {len(others)} Xids: {foreign_events}; records of nodes outside its slice "
            f"({node_name(s.first)}..{node_name(s.first + s.count - 1)}): {foreign_nodes}"
            + (
                " -> isolated"
                if foreign_events == foreign_nodes == 0 and own_drains == len(own)
                else " -> NO"
            )
        )
    return lines


def measure_shards(args: argparse.Namespace, pg: PostgresServer) -> dict[str, Any]:
    k = args.shards
    with tempfile.TemporaryDirectory(prefix="watchd-100k-shards-") as tmp:
        shards = []
        for i, (first, count) in enumerate(slices(args.nodes, k), start=1):
            work = Path(tmp) / f"shard-{i}"
            work.mkdir()
            shards.append(Shard(i, first, count, pg.create_database(), work))
        try:
            for s in shards:  # one at a time: each waits for its election
                s.engine = start_engine(
                    s.work, s.count, "postgres", (pg.dsn(s.db), pg.password_file), s.lease, first=s.first
                )
                print(
                    f"[{s.lease}] leader of its lease, database {s.db}, nodes "
                    f"{node_name(s.first)}..{node_name(s.first + s.count - 1)}",
                    flush=True,
                )
            wrong = check_leaders(pg, shards)
            if wrong:
                raise RuntimeError("not every shard leads its own lease: " + "; ".join(wrong))
            print(f"all {k} engines lead their own leases at once", flush=True)
            print(f"[shards] idle, together: {args.xids} Xid 79 injections each, status/drains", flush=True)
            idles = _together(
                [partial(idle_phase, s.live, s.count, args.xids, args.xid_gap, s.first) for s in shards]
            )
            print(
                f"[shards] load, together: {k} x {args.nodes // k:,} agents x 8 GPUs, warm-up "
                f"{args.warmup:g} s, measured {args.duration:g} s; load average before "
                f"{os.getloadavg()[0]:.2f}",
                flush=True,
            )
            plans = [
                Plan(s.live.url, TOKEN, s.count, args.duration, args.warmup, args.procs, first=s.first)
                for s in shards
            ]
            runs = [Run(p) for p in plans]  # started here, in this thread (they fork)
            loadavg: list[float] = []
            sampler = threading.Thread(target=_sample_load, args=(runs[0], loadavg), daemon=True)
            sampler.start()
            loads = _together(
                [
                    partial(load_phase, s.live, p, args.xids, args.xid_gap, 1, r)
                    for s, p, r in zip(shards, plans, runs, strict=True)
                ]
            )
            sampler.join()
            leaders_after = check_leaders(pg, shards)
            sent = [set(i["xid_sent"]) | set(x["xid_sent"]) for i, x in zip(idles, loads, strict=True)]
            iso = isolation(pg, shards, sent)
        finally:
            codes = [s.engine.stop(timeout=60) if s.engine is not None else None for s in shards]
        results = []
        for s, idle, load, code in zip(shards, idles, loads, codes, strict=True):
            assert s.engine is not None
            tracebacks = s.engine.log_path.read_text(errors="replace").count("Traceback")
            if args.logs is not None:
                args.logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(s.engine.log_path, args.logs / f"engine-{s.lease}-{args.nodes}.log")
            name = f"postgres {s.lease} ({s.count:,} agents)"
            r = {"store": name, "idle": idle, "load": load, "exit_code": code, "tracebacks": tracebacks}
            results.append(summarize(r))
    return {"shards": results, "loadavg": loadavg, "isolation": iso, "leaders_after": leaders_after}


def _sample_load(run: Run, out: list[float]) -> None:
    time.sleep(max(0.0, run.measure_from - time.time()))
    while time.time() < run.measure_to:
        out.append(os.getloadavg()[0])
        time.sleep(5.0)


def totals(r: dict[str, Any]) -> dict[str, Any]:
    s = r["shards"]
    return {
        "shards": len(s),
        "agents": sum(x["loadgen"]["nodes"] for x in s),
        "engine_cpu_cores": round(sum(x["engine_cpu_cores"] for x in s), 3),
        "engine_rss_mib": round(sum(x["engine_rss_mib"] for x in s), 1),
        "engine_peak_rss_mib": round(sum(x["engine_peak_rss_mib"] for x in s), 1),
        "events_per_s": round(sum(x["events_per_s"] for x in s), 1),
        "generator_cpu_cores": round(sum(x["loadgen"]["cpu_cores"] for x in s), 3),
        "nothing_dropped": all(x["nothing_dropped"] for x in s),
        "generator_behind": any(x["loadgen"]["behind"] for x in s),
        "loadavg_1m_min": min(r["loadavg"], default=float("nan")),
        "loadavg_1m_max": max(r["loadavg"], default=float("nan")),
        "isolated": all(line.endswith("-> isolated") for line in r["isolation"]),
        "leaders_after": not r["leaders_after"],
    }


def print_shards(r: dict[str, Any]) -> dict[str, Any]:
    for s in r["shards"]:
        print_summary(s)
    t = totals(r)
    print(
        f"\n== total: {t['shards']} shards, {t['agents']:,} agents, {t['agents'] * 8:,} GPUs, the same span; "
        f"load average (1 min) {t['loadavg_1m_min']:.2f}-{t['loadavg_1m_max']:.2f}"
    )
    print(
        f"  engines     CPU {t['engine_cpu_cores']:.3f} cores, RSS {t['engine_rss_mib']:.0f} MiB "
        f"(peaks {t['engine_peak_rss_mib']:.0f}); {t['events_per_s']:,.0f} events/s; generators "
        f"{t['generator_cpu_cores']:.3f} cores"
    )
    print(
        f"  dropped     {'nothing anywhere' if t['nothing_dropped'] else 'NOT CLEAN (the shards above)'}; "
        f"generators {'ALL kept to schedule' if not t['generator_behind'] else 'one or more FELL BEHIND'}"
    )
    print(
        f"  leases      every engine led its own lease before the load and "
        f"{'still after it' if t['leaders_after'] else 'NOT after it: ' + '; '.join(r['leaders_after'])}"
    )
    for line in r["isolation"]:
        print(f"  isolation   {line}")
    return t


def main_shards(args: argparse.Namespace) -> int:
    from tests.harness.postgres import available

    ok, why = available()
    if not ok:
        print(f"[shards] PostgreSQL needed: {why}")
        return 1
    print(f"{args.shards} shards on one private PostgreSQL server (this machine), a database and lease each")
    with PostgresServer() as pg:
        r = measure_shards(args, pg)
    t = print_shards(r)
    if args.json:
        args.json.write_text(json.dumps({**r, "totals": t}, indent=2, default=str))
    if t["generator_behind"]:
        print("\nNOT A MEASUREMENT: a load generator fell behind its schedule (see 'generator' above)")
    return 1 if t["generator_behind"] or not t["isolated"] or not t["leaders_after"] else 0


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument(
        "--shards",
        type=int,
        default=2,
        help="K engines at once, each its own database, lease shard-i and 1/K of --nodes (default 2)",
    )
    args = ap.parse_args()
    prepare(args, shards=True)
    return main_shards(args)


if __name__ == "__main__":
    raise SystemExit(main())
