"""Soak: 10^6 inputs (``--inputs``; ``--quick``: 20,000) across every endpoint of a real ``watchd engine``
(dry-run, state database) and a real ``watchd agent`` (heartbeat port, /metrics, /healthz), over loopback.

The mix, round-robin: valid Xid 79 batches on fresh nodes (``--xid-nodes N``: cycling over N names; each
event must end up with an audited drain decision, whatever its outcome), batches of valid
gpu_summary events with hostile neighbours (the valid ones must be accepted), hostile bodies (random bytes,
random JSON, deep nesting, >4300-digit integers, wrong encodings), every GET of the engine with odd queries,
held release/discard with odd ids, hostile heartbeats and GETs to the agent.

Reports: 5xx count (by input kind), tracebacks in each daemon's log, lost audit records (an Xid 79 event
answered 200 whose id is not in GET /api/v1/actions, or not in the state database), valid events accepted
vs sent, RSS of both daemons over time. The goal: 0 5xx, 0 tracebacks, 0 lost, bounded memory.

    python benchmarks/soak.py --quick
    python benchmarks/soak.py --inputs 1200000 --dedup-max-ids 20000 --max-state-mib 16 \
        --reliability-max-nodes 20000 --xid-nodes 2000     # every bound small: does memory level off?
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from tests.daemons import Daemon, agent_config
from tests.fault.common import AUTH, rss_kib, start_engine

Input = tuple[str, str, str, str, bytes, dict[str, str]]  # kind, daemon, method, path, body, headers


def _event(node: str, kind: str, attrs: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex,
        "node": node,
        "source": "kmsg" if kind == "xid" else "nvml",
        "kind": kind,
        "time": time.time(),
        "attrs": attrs,
    }


def _batch(events: list[dict[str, Any]]) -> bytes:
    return json.dumps({"version": 1, "node": "soak", "events": events}).encode()


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 4 or r < 0.4:
        return rng.choice([None, True, 1, -1.5, "x", "", "\u202e", "a" * rng.randint(0, 300), 10**20])
    if r < 0.7:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {str(rng.random())[:6]: _random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


class Mix:
    def __init__(self, seed: int, xid_nodes: int = 0) -> None:
        self.rng = random.Random(seed)
        self.n = 0
        self.xid_nodes = xid_nodes  # 0: every Xid 79 on a node never seen before
        self.last_xid = ""  # the event id of the last Xid 79 made
        self.valid_sent = 0

    def next(self) -> Input:
        rng = self.rng
        self.n += 1
        k = self.n % 14
        if k == 0:
            node = f"soak-{self.n // 14 % self.xid_nodes if self.xid_nodes else self.n}"
            event = _event(node, "xid", {"xid": 79, "pci_bus_id": "0000:3b:00.0"})
            self.last_xid = event["id"]
            body = _batch([event])
            return ("xid79", "engine", "POST", "/api/v1/events", body, AUTH)
        if k == 1:
            valid = [
                _event(f"sum-{rng.randrange(5000)}", "gpu_summary", {"gpu": 0, "util_mean": 50.0})
                for _ in range(3)
            ]
            hostile = [_random_json(rng) for _ in range(2)]
            self.valid_sent += len(valid)
            return ("mixed_batch", "engine", "POST", "/api/v1/events", _batch(valid + hostile), AUTH)
        if k == 2:
            return (
                "random_bytes",
                "engine",
                "POST",
                "/api/v1/events",
                rng.randbytes(rng.randint(0, 200)),
                AUTH,
            )
        if k == 3:
            body = json.dumps(_random_json(rng)).encode()
            return ("random_json", "engine", "POST", "/api/v1/events", body, AUTH)
        if k == 4:
            special = rng.choice(["deep", "bigint", "gzip_label", "br", "short_gzip", "noauth"])
            headers = dict(AUTH)
            body = _batch([_event("x", "gpu_summary", {})])
            if special == "deep":
                body = b"[" * 20_000 + b"]" * 20_000
            elif special == "bigint":
                body = b'{"version": 1, "events": [' + b"9" * 5000 + b"]}"
            elif special == "gzip_label":
                headers["Content-Encoding"] = "gzip"
            elif special == "br":
                headers["Content-Encoding"] = "br"
            elif special == "short_gzip":
                headers["Content-Encoding"] = "gzip"
                body = gzip.compress(body)[:12]
            else:
                headers = {"Content-Type": "application/json"}
            return (f"hostile_{special}", "engine", "POST", "/api/v1/events", body, headers)
        if k in (5, 6):
            path = rng.choice(
                ["/api/v1/status", "/api/v1/actions", "/api/v1/held", "/metrics", "/healthz", "/readyz"]
            )
            query = rng.choice(["", "?limit=5", "?limit=abc", "?limit=-3", "?node=x"])
            # the API asks for a token since viewers/operators came: most GETs carry it, some do not
            headers = dict(AUTH) if rng.random() < 0.8 else {}
            return ("engine_get", "engine", "GET", path + query, b"", headers)
        if k == 7:
            held = rng.choice(["1", "abc", "-1", "99999999999999999999"])
            verb = rng.choice(["release", "discard"])
            return ("held_resolve", "engine", "POST", f"/api/v1/held/{held}/{verb}", b"", AUTH)
        if k in (8, 9, 10):
            r = rng.random()
            if r < 0.5:
                body = json.dumps(_random_json(rng)).encode()
            elif r < 0.9:
                body = json.dumps(
                    {"job": str(rng.randrange(100)), "rank": rng.randrange(8), "step": rng.randrange(10**6)}
                ).encode()
            else:
                body = b"[" * 20_000 + b"]" * 20_000
            return (
                "heartbeat",
                "heartbeat",
                "POST",
                "/v1/heartbeat",
                body,
                {"Content-Type": "application/json"},
            )
        path = rng.choice(["/metrics", "/healthz", "/nope"])
        return ("agent_get", "agent", "GET", path, b"", {})


def _db_drain_events(db: Path) -> set[str]:
    """The events with an audited drain decision (whatever its outcome: dry-run, deduplicated, ...)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return {r[0] for r in conn.execute("SELECT event_id FROM audit WHERE action = 'drain'")}
    finally:
        conn.close()


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    total, concurrency = 20_000 if args.quick else args.inputs, args.concurrency
    tmp = Path(tempfile.mkdtemp(prefix="watchd-soak-"))
    db = tmp / "state.db"
    extra: dict[str, Any] = {"ingest": {"dedup_max_ids": args.dedup_max_ids}}
    if args.max_state_mib is not None:
        extra["detectors"] = {"max_state_mib": args.max_state_mib}
    if args.reliability_max_nodes is not None:
        extra["reliability"] = {"max_nodes": args.reliability_max_nodes}
    engine = start_engine(tmp, mode="dry-run", db=db, **extra)
    log = tmp / "kern.log"
    log.write_text("")
    agent = Daemon("agent", agent_config("gpu-1", engine.port, tmp / "token", log), tmp)
    agent.wait_ready()
    hb_port = int(yaml.safe_load(agent.config_path.read_text())["heartbeat"]["http_port"])
    bases = {"engine": engine.url, "agent": agent.url, "heartbeat": f"http://127.0.0.1:{hb_port}"}
    mix = Mix(args.seed, args.xid_nodes)
    statuses: Counter[tuple[str, int]] = Counter()
    errors: Counter[str] = Counter()
    xid_ok: list[str] = []
    accepted_valid = 0
    rss: list[tuple[float, int, int]] = []
    t0 = time.monotonic()
    done = 0
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            rss.append((time.monotonic() - t0, rss_kib(engine.proc.pid), rss_kib(agent.proc.pid)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 2.0)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done, accepted_valid
        while done < total:
            done += 1
            kind, daemon, method, path, body, headers = mix.next()
            xid = mix.last_xid if kind == "xid79" else None
            for attempt in range(3):  # a connection the server closed after an error reply: send again
                try:
                    async with session.request(
                        method,
                        bases[daemon] + path,
                        data=body or None,
                        headers=headers,
                        timeout=aiohttp.ClientTimeout(total=30),
                    ) as resp:
                        raw = await resp.read()
                        statuses[(kind, resp.status)] += 1
                        if resp.status == 200 and kind in ("xid79", "mixed_batch"):
                            reply = json.loads(raw)
                            if xid is not None:
                                xid_ok.append(xid)
                            else:
                                accepted_valid += int(reply.get("accepted", 0)) + int(
                                    reply.get("duplicates", 0)
                                )
                    break
                except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
                    errors[f"{kind}: {type(exc).__name__} (attempt {attempt + 1})"] += 1
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    errors[f"{kind}: {type(exc).__name__}"] += 1
                    break

    sampler = asyncio.create_task(sample())
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        last = time.monotonic()
        workers = [asyncio.create_task(worker(session)) for _ in range(concurrency)]
        while not all(w.done() for w in workers):
            await asyncio.sleep(1.0)
            if time.monotonic() - last > 15:
                last = time.monotonic()
                print(f"  {done}/{total} inputs, {time.monotonic() - t0:.0f}s", flush=True)
        await asyncio.gather(*workers)
    elapsed = time.monotonic() - t0
    await asyncio.sleep(2.0)  # let the last decisions be recorded
    stop.set()
    await sampler
    rss.append((time.monotonic() - t0, rss_kib(engine.proc.pid), rss_kib(agent.proc.pid)))
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{engine.url}/api/v1/actions?limit=10000", headers=AUTH) as resp,
    ):
        listing = await resp.json()
    if resp.status != 200:
        raise SystemExit(f"GET /api/v1/actions answered {resp.status}: {listing}")
    api_actions = listing["actions"]
    api_events = {a["event_id"] for a in api_actions if a["action"] == "drain"}
    db_events = _db_drain_events(db)
    engine.stop()
    agent.stop()
    tracebacks = {
        "engine": engine.log_path.read_text(errors="replace").count("Traceback"),
        "agent": agent.log_path.read_text(errors="replace").count("Traceback"),
    }
    log_bytes = {"engine": engine.log_path.stat().st_size, "agent": agent.log_path.stat().st_size}
    fivexx = {f"{k} {s}": n for (k, s), n in sorted(statuses.items()) if s >= 500}
    lost_db = [e for e in xid_ok if e not in db_events]
    recent = xid_ok[
        -min(len(xid_ok), 3000) :
    ]  # the API lists the newest 10,000 actions (drains and requeues)
    lost_api = [e for e in recent if e not in api_events]
    return {
        "inputs": done,
        "seconds": round(elapsed, 1),
        "inputs_per_s": round(done / elapsed),
        "status_by_kind": {f"{k} {s}": n for (k, s), n in sorted(statuses.items())},
        "client_errors": dict(errors),
        "5xx_total": sum(fivexx.values()),
        "5xx": fivexx,
        "tracebacks": tracebacks,
        "log_bytes": log_bytes,
        "xid79_answered_200": len(xid_ok),
        "lost_audit_db": len(lost_db),
        "lost_audit_api_newest_3000": len(lost_api),
        "valid_events_sent": mix.valid_sent,
        "valid_events_accepted": accepted_valid,
        "rss_s_mib_engine": _curve(rss, 1),
        "rss_s_mib_agent": _curve(rss, 2),
        "workdir": str(tmp),
    }


def _curve(rss: list[tuple[float, int, int]], i: int) -> list[tuple[int, float]]:
    """About ten (seconds, MiB) samples, the last one included."""
    picked = [*rss[:: max(1, len(rss) // 10)], rss[-1]]
    return [(round(r[0]), round(r[i] / 1024, 1)) for r in picked]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="20,000 inputs")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument(
        "--dedup-max-ids", type=int, default=1_000_000, help="ingest.dedup_max_ids (the shipped default)"
    )
    ap.add_argument(
        "--max-state-mib", type=float, default=None, help="detectors.max_state_mib (default: 2 GiB)"
    )
    ap.add_argument(
        "--reliability-max-nodes", type=int, default=None, help="reliability.max_nodes (default: 131,072)"
    )
    ap.add_argument(
        "--xid-nodes",
        type=int,
        default=0,
        help="Xid 79s cycle over this many node names (default 0: each on a node never seen before, so the "
        "engine's per-node state grows with the run up to its bounds)",
    )
    result = asyncio.run(soak(ap.parse_args()))
    for key, value in result.items():
        print(f"{key:28} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
