"""Failover time of an HA pair: two real ``watchd engine`` processes on one real PostgreSQL.

Per round, with the follower warm:
- crash: ``kill -9`` of the leader -> the follower answers ``/readyz`` 200 (it holds the lease), and -> the
  first action it takes (an Xid 79 sent by an "agent" that retries until an engine takes the batch, drained
  by the in-memory scheduler, its audit record in the shared store);
- clean: SIGTERM of the leader (it releases the lease) -> the follower is ready.

Floors, measured in the same run: a crashed leader's lease cannot be taken before it expires
(``lease_duration_s``, by the database's clock), so the crash failover is reported as a ratio to the lease
duration; a released lease is taken at the follower's next round (at most ``retry_period_s``).

Run: ``python benchmarks/failover.py [--rounds 5] [--lease-s 3]`` (needs the Debian package postgresql).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ha.pair import HaPair, xid  # noqa: E402
from tests.harness.postgres import PostgresServer  # noqa: E402

NODES = [f"node-{i}" for i in range(1, 101)]


def wait(check: object, timeout: float = 60.0, step: float = 0.01) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return time.monotonic()
        time.sleep(step)
    raise RuntimeError("timed out")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lease-s", type=float, default=3.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    crash_ready: list[float] = []
    crash_acted: list[float] = []
    clean_ready: list[float] = []
    with PostgresServer() as pg, tempfile.TemporaryDirectory(prefix="watchd-failover-") as tmp:
        pair = HaPair(
            pg,
            Path(tmp),
            slurm_conf=None,
            lease_s=args.lease_s,
            extra={
                "fake": {"enabled": True, "nodes": NODES},
                "safety": {"max_fraction": 1.0, "max_nodes": 100_000},
            },
        )
        try:
            pair.start("a")
            pair.leader()
            pair.start("b")
            for n in range(1, args.rounds + 1):
                name, leader = pair.leader()
                follower = pair.engines["b" if name == "a" else "a"]
                killed = time.monotonic()
                leader.proc.send_signal(signal.SIGKILL)
                leader.proc.wait()
                crash_ready.append(wait(lambda f=follower: pair.ready(f)) - killed)
                event = xid(NODES[n % len(NODES)])
                pair.deliver([event])
                acted = wait(
                    lambda e=event: pair.rows(
                        "SELECT 1 FROM audit WHERE event_id = %s AND outcome = 'drained'", (e.id,)
                    ),
                    step=0.005,
                )
                crash_acted.append(acted - killed)
                pair.restart(name)
                # clean handover: the new leader stops, releasing the lease
                name, leader = pair.leader()
                follower = pair.engines["b" if name == "a" else "a"]
                stopped = time.monotonic()
                leader.stop()
                clean_ready.append(wait(lambda f=follower: pair.ready(f)) - stopped)
                pair.restart(name)
        finally:
            pair.stop()
    retry = args.lease_s / 6
    result = {
        "where": "this machine (2 shared cores), PostgreSQL 15 on loopback",
        "rounds": args.rounds,
        "lease_duration_s": args.lease_s,
        "retry_period_s": retry,
        "crash_to_leader_s": {"median": statistics.median(crash_ready), "max": max(crash_ready)},
        "crash_to_first_action_s": {"median": statistics.median(crash_acted), "max": max(crash_acted)},
        "crash_ratio_to_lease": statistics.median(crash_ready) / args.lease_s,
        "clean_handover_s": {"median": statistics.median(clean_ready), "max": max(clean_ready)},
        "clean_ratio_to_retry_period": statistics.median(clean_ready) / retry,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"failover, {args.rounds} rounds, lease {args.lease_s:.1f} s, retry period {retry:.2f} s"
        f" ({result['where']})"
    )
    print(
        f"  kill -9 -> follower leads: median {result['crash_to_leader_s']['median']:.2f} s, "
        f"max {result['crash_to_leader_s']['max']:.2f} s ({result['crash_ratio_to_lease']:.2f}x the lease, "
        "the floor)"
    )
    print(
        "  kill -9 -> first action by the new leader: "
        f"median {result['crash_to_first_action_s']['median']:.2f} s, "
        f"max {result['crash_to_first_action_s']['max']:.2f} s"
    )
    print(
        f"  SIGTERM (lease released) -> follower leads: median {result['clean_handover_s']['median']:.2f} s, "
        f"max {result['clean_handover_s']['max']:.2f} s ({result['clean_ratio_to_retry_period']:.2f}x the "
        "retry period, the floor)"
    )


if __name__ == "__main__":
    main()
