"""Scale: what a big fleet and many held actions cost a real ``watchd engine``.

Nodes (dry-run): the fleet grows to each checkpoint (default 1,000 / 10,000 / 100,000 nodes); every node
reports one gpu_summary, one application Xid (13, no rule fires) and every tenth node two lost GPUs. At each
checkpoint: the per-event ingest cost of a fixed probe batch (2,000 gpu_summary events of 10 known nodes),
GET /api/v1/status time, and the engine's RSS per node.

Held actions (enforce, the fake scheduler of tests/fault/fake_slurm.py, breaker at one node): Xid 79 on new
nodes are held, up to each checkpoint (default 100 / 1,000 / 10,000 held). At each: seconds to decide a batch
of 20 more, GET /api/v1/status time, per-event ingest cost of the probe batch.

Each figure is printed beside its floor, measured in the same run on the empty engine. Both curves
should be flat. ``--quick``: nodes 500/2,000/5,000 and held 50/150/300 (a reduced size: say so).

    python benchmarks/scale.py --quick
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemons import Daemon
from tests.fault.common import AUTH, fake_slurm, request, rss_kib, start_engine


def _ev(node: str, kind: str, attrs: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex,
        "node": node,
        "source": "kmsg" if kind == "xid" else "nvml",
        "kind": kind,
        "time": time.time(),
        "attrs": attrs,
    }


def _post(engine: Daemon, events: list[dict[str, Any]], batch: int = 5000) -> None:
    for i in range(0, len(events), batch):
        body = json.dumps({"version": 1, "node": "scale", "events": events[i : i + batch]}).encode()
        status, raw = request(engine.url, "POST", "/api/v1/events", body, AUTH, timeout=600)
        if status != 200:
            raise RuntimeError(f"ingest answered {status}: {raw[:300]!r}")


def _probe_us(engine: Daemon) -> float:
    """Microseconds per event of one 2,000-event batch of summaries of 10 known nodes (best of 3)."""
    best = float("inf")
    for _ in range(3):
        events = [
            _ev(f"probe-{i % 10}", "gpu_summary", {"gpu": i % 8, "util_mean": 90.0, "window_s": 5})
            for i in range(2000)
        ]
        t0 = time.monotonic()
        _post(engine, events)
        best = min(best, time.monotonic() - t0)
    return best / 2000 * 1e6


def _status_s(engine: Daemon) -> float:
    best = float("inf")
    for _ in range(2):
        t0 = time.monotonic()
        status, _ = request(engine.url, "GET", "/api/v1/status", timeout=600)
        if status != 200:
            raise RuntimeError(f"status answered {status}")
        best = min(best, time.monotonic() - t0)
    return best


def nodes_curve(tmp: Path, checkpoints: list[int]) -> list[dict[str, Any]]:
    (tmp / "nodes").mkdir()
    engine = start_engine(tmp / "nodes", mode="dry-run")
    rows: list[dict[str, Any]] = []
    try:
        time.sleep(1.0)
        rss0 = rss_kib(engine.proc.pid)
        rows.append(
            {
                "nodes": 0,
                "ingest_us_per_event": _probe_us(engine),
                "status_s": _status_s(engine),
                "rss_mib": rss0 / 1024,
                "rss_bytes_per_node": 0.0,
            }
        )
        have = 0
        for target in checkpoints:
            t0 = time.monotonic()
            events: list[dict[str, Any]] = []
            for i in range(have, target):
                node = f"node-{i:06d}"
                events.append(
                    _ev(
                        node, "gpu_summary", {"gpu": 0, "util_mean": 95.0, "power_mean": 600.0, "window_s": 5}
                    )
                )
                events.append(_ev(node, "xid", {"xid": 13, "pci_bus_id": "0000:3b:00.0"}))
                if i % 10 == 0:
                    for gpu in (1, 2):
                        events.append(
                            _ev(node, "gpu_health", {"condition": "gpu_lost", "gpu": gpu, "value": 1})
                        )
            _post(engine, events)
            grow_s = time.monotonic() - t0
            have = target
            time.sleep(0.5)
            rss = rss_kib(engine.proc.pid)
            rows.append(
                {
                    "nodes": target,
                    "ingest_us_per_event": _probe_us(engine),
                    "status_s": _status_s(engine),
                    "rss_mib": rss / 1024,
                    "rss_bytes_per_node": (rss - rss0) * 1024 / target,
                    "grow_events": len(events),
                    "grow_us_per_event": grow_s / max(1, len(events)) * 1e6,
                }
            )
            print("  nodes", rows[-1], flush=True)
    finally:
        engine.stop()
    return rows


def _drains(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return int(conn.execute("SELECT count(*) FROM audit WHERE action = 'drain'").fetchone()[0])
    finally:
        conn.close()


def _decide(engine: Daemon, db: Path, first: int, n: int, timeout: float = 3600) -> float:
    """Post Xid 79 on nodes first..first+n-1; seconds until all n drains are decided."""
    want = _drains(db) + n
    events = [_ev(f"n{first + i}", "xid", {"xid": 79, "pci_bus_id": "0000:3b:00.0"}) for i in range(n)]
    t0 = time.monotonic()
    for i in range(0, n, 100):
        _post(engine, events[i : i + 100])
    deadline = t0 + timeout
    while _drains(db) < want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{want - _drains(db)} drains not decided in {timeout}s")
        time.sleep(0.02)
    return time.monotonic() - t0


def held_curve(tmp: Path, checkpoints: list[int]) -> list[dict[str, Any]]:
    work = tmp / "held"
    work.mkdir()
    db = work / "state.db"
    slurm, env = fake_slurm(work, pool="n[1-1000000]")
    engine = start_engine(
        work,
        mode="enforce",
        db=db,
        fake=slurm,
        env=env,
        safety={"max_fraction": 1.0, "max_nodes": 1, "pools_refresh_s": 3600},
    )
    rows: list[dict[str, Any]] = []
    try:
        _decide(engine, db, 1, 1)  # the one drain the breaker allows
        next_node = 2

        def row(held: int) -> dict[str, Any]:
            nonlocal next_node
            batch_s = _decide(engine, db, next_node, 20)
            next_node += 20
            return {
                "held": held,
                "batch_of_20_s": batch_s,
                "status_s": _status_s(engine),
                "ingest_us_per_event": _probe_us(engine),
            }

        rows.append(row(0))
        held = 20
        for target in checkpoints:
            t0 = time.monotonic()
            if target > held:
                _decide(engine, db, next_node, target - held)
                next_node += target - held
            grow_s = time.monotonic() - t0
            listed = len(json.loads(request(engine.url, "GET", "/api/v1/held", timeout=600)[1])["held"])
            r = row(listed)
            r["grow_s"] = grow_s
            held = listed + 20
            rows.append(r)
            print("  held", rows[-1], flush=True)
    finally:
        engine.stop()
    return rows


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    lines = ["  ".join(f"{c:>22}" for c in cols)]
    for r in rows:
        lines.append(
            "  ".join(
                f"{r.get(c, ''):>22.4g}" if isinstance(r.get(c), float) else f"{r.get(c, ''):>22}"
                for c in cols
            )
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1000,10000,100000", help="node checkpoints")
    ap.add_argument("--held", default="100,1000,10000", help="held-action checkpoints")
    ap.add_argument("--quick", action="store_true", help="nodes 500,2000,5000 and held 50,150,300 (reduced)")
    args = ap.parse_args()
    nodes = [500, 2000, 5000] if args.quick else [int(x) for x in args.nodes.split(",")]
    held = [50, 150, 300] if args.quick else [int(x) for x in args.held.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="watchd-scale-"))
    print(f"scale benchmark{' (REDUCED SIZE: --quick)' if args.quick else ''}: nodes {nodes}, held {held}")
    n_rows = nodes_curve(tmp, nodes)
    h_rows = held_curve(tmp, held)
    print("\nnodes (first row: the empty engine, the floor)")
    print(
        _table(
            n_rows,
            [
                "nodes",
                "ingest_us_per_event",
                "status_s",
                "rss_mib",
                "rss_bytes_per_node",
                "grow_us_per_event",
            ],
        )
    )
    print("\nheld actions (first row: none held, the floor)")
    print(_table(h_rows, ["held", "batch_of_20_s", "status_s", "ingest_us_per_event", "grow_s"]))
    print(json.dumps({"quick": args.quick, "nodes": n_rows, "held": h_rows}))


if __name__ == "__main__":
    main()
