"""One engine for 100,000 GPUs, measured with real connections.

A real ``watchd engine`` process started from the CLI (``watchd engine --config FILE``), its state in SQLite
(a file) or in PostgreSQL (a private server, tests/harness/postgres.py), fed by benchmarks/loadgen.py:
12,500 agents of 8 GPUs (100,000 GPUs), each on its own keep-alive connection, one batch of per-GPU
summaries every 5 s (20,000 events/s), in the agent's wire format and schedule.

Shipped defaults but for what the measurement needs, each said in the output:

- ``mode: enforce`` and the in-memory scheduler (``fake:``) with the fleet's 12,500 nodes: a drain decision
  goes through the whole action pipeline (durable intent, breaker, scheduler call, audit) without Slurm;
- ``safety.max_nodes`` 1,000 (default 50 per hour): the benchmark drains more nodes than that in minutes,
  and past the breaker a drain is held, not decided (10% of the 12,500-node partition, the default
  fraction, stays);
- ``slurm.enabled: false`` (no Slurm here), the token in a file, a free loopback port.

Phases, each on a fresh engine per store:

1. **idle**: the engine with no load; ``--xids`` Xid 79 lines, one about every ``--xid-gap`` s, each sent as
   an agent sends it (the agent's own event builder over the kernel line) on one more keep-alive connection.
   Xid to decision = the drain's audit record time (``GET /api/v1/actions``) less the event's time (the
   kernel line's). Also ``watchd status`` / ``watchd drains`` (the CLI, a process each, and the bare HTTP
   GET) response times: the floors of the loaded figures.
2. **load**: the load generator's warm-up (``--warmup``), then ``--duration`` s measured: engine CPU
   (utime + stime from /proc/<pid>/stat over the wall time) and RSS, the detector cycle
   (``watchd_detector_cycle_seconds`` sum/count, the longest slice), ingest lag (the generator's: event time
   to the engine's reply, which waits for the batch's evaluation; and the engine's
   ``watchd_event_age_seconds``: event time to arrival), the same Xid injections and status/drains timings
   meanwhile, and every drop counter the engine has (ingest refusals by reason, invalid events, ack
   timeouts, fleet evictions) and the generator's (undelivered, refused, timeouts).

The goals: the engine at 100,000 GPUs on at most one core; Xid-to-decision p99 under load within
2x idle; nothing dropped. A generator that fell behind its schedule makes the run no measurement: said, and
exit 1.

    python benchmarks/scale_100k.py                  # 12,500 nodes, SQLite then PostgreSQL (~10 min)
    python benchmarks/scale_100k.py --store sqlite --nodes 6250
    python benchmarks/scale_100k.py --quick          # under a minute: 500 nodes, SQLite, 20 s (REDUCED)
    python benchmarks/scale_shards.py --shards 2 --nodes 2000   # two engines at once
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from benchmarks.fleet import proc_cpu_s, proc_mem_mib, quantile  # noqa: E402
from benchmarks.loadgen import Plan, Report, Run, node_name, pct  # noqa: E402
from tests.daemons import Daemon, engine_config, free_port, watchd_command  # noqa: E402
from watchd.agent.runner import xid_event  # noqa: E402
from watchd.model.events import INGEST_PATH, batch_to_wire  # noqa: E402
from watchd.sources.base import LogLine  # noqa: E402
from watchd.xid import XidParser  # noqa: E402

TOKEN = "scale-100k-token"
XID_LINE = "NVRM: Xid (PCI:0000:18:00): 79, pid=<unknown>, name=<unknown>, GPU has fallen off the bus."


# ------------------------------------------------------------------------------------------ the engine


def start_engine(
    work: Path,
    nodes: int,
    store: str,
    pg_dsn: tuple[str, Path] | None,
    lease: str | None = None,
    first: int = 0,
) -> Daemon:
    """The engine of ``nodes`` nodes from ``first`` on; with ``lease``, returned once it leads (or raises)."""
    token = work / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    config = engine_config(free_port(), token, "enforce", None)
    config["fake"] = {"enabled": True, "nodes": [node_name(i) for i in range(first, first + nodes)]}
    config["safety"] = {"max_nodes": 1000}
    config["log"] = {"format": "json", "level": "warning"}
    if store == "sqlite":
        config["state"] = {"path": str(work / "state.db")}
    else:
        assert pg_dsn is not None
        config["state"] = {
            "kind": "postgres",
            "postgres": {"dsn": pg_dsn[0], "password_file": str(pg_dsn[1])},
        }
        if lease is not None:  # one shard of several: its own database and lease (docs/scale.md)
            config["state"]["postgres"]["leader_election"] = {
                "enabled": True,
                "lease_name": lease,
                "identity": f"{lease}-engine",
            }
    engine = Daemon("engine", config, work)
    engine.wait_ready(timeout=120)
    deadline = time.monotonic() + 60
    while lease is not None and not leads(engine.url):  # elected: /readyz 200
        if time.monotonic() > deadline:
            engine.stop(timeout=30)
            raise RuntimeError(f"the engine did not take lease {lease} in 60 s:\n{engine.log()[-3000:]}")
        time.sleep(0.2)
    return engine


def leads(url: str) -> bool:
    """Whether the engine is ready as the leader (/readyz 200, detail 'leader')."""
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=5)
    try:
        conn.request("GET", "/readyz")
        resp = conn.getresponse()
        return resp.status == 200 and json.loads(resp.read()).get("detail") == "leader"
    except (OSError, ValueError, http.client.HTTPException):
        return False
    finally:
        conn.close()


class Metrics:
    """One /metrics snapshot: the sums and counts this benchmark compares."""

    def __init__(self, url: str) -> None:
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        self.values: dict[str, float] = {}
        self.age_buckets: dict[float, float] = {}
        self.lag_buckets: dict[float, float] = {}  # watchd_event_loop_lag_seconds
        self.rejected: dict[str, float] = {}
        self.evicted: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "watchd_event_age_seconds_bucket":
                    self.age_buckets[float(s.labels["le"])] = s.value
                elif s.name == "watchd_event_loop_lag_seconds_bucket":
                    self.lag_buckets[float(s.labels["le"])] = s.value
                elif s.name == "watchd_ingest_rejected_total":
                    self.rejected[s.labels["reason"]] = s.value
                elif s.name == "watchd_fleet_evicted_total":
                    self.evicted[s.labels["what"]] = s.value
                elif not s.labels:
                    self.values[s.name] = s.value

    def get(self, name: str) -> float:
        return self.values.get(name, 0.0)


# ----------------------------------------------------------------------------------- Xid injections


@dataclass
class Injections:
    """Xid 79 lines sent one at a time on one keep-alive connection, as an agent ships them."""

    sent: dict[str, float] = field(default_factory=dict)  # event id -> the kernel line's time
    reply_s: list[float] = field(default_factory=list)  # request written -> answered (decisions recorded)
    errors: int = 0


def inject_xids(url: str, nodes: list[str], gap_s: float, out: Injections, stop: threading.Event) -> None:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    parser = XidParser()
    rng = random.Random(35)
    for n, node in enumerate(nodes):
        if stop.is_set():
            break
        now = time.time()
        line = LogLine(XID_LINE, now, f"kmsg:bench:{n}")
        records = parser.feed(XID_LINE)
        event = xid_event(node, "kmsg", line, records[-1], 0)
        body = json.dumps(batch_to_wire(node, [event]), separators=(",", ":")).encode()
        t0 = time.monotonic()
        try:
            conn.request("POST", INGEST_PATH, body, headers)
            resp = conn.getresponse()
            resp.read()
            ok = resp.status == 200
        except (OSError, http.client.HTTPException):
            ok = False
            conn.close()
        if ok:
            out.sent[event.id] = event.time
            out.reply_s.append(time.monotonic() - t0)
        else:
            out.errors += 1
        stop.wait(gap_s * (0.5 + rng.random()))
    conn.close()


def decisions(url: str, sent: dict[str, float]) -> list[float]:
    """Seconds from each injected Xid's line to its drain's audit record."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", "/api/v1/actions?limit=10000", headers={"Authorization": f"Bearer {TOKEN}"})
    actions = json.loads(conn.getresponse().read())["actions"]
    conn.close()
    out = []
    for a in actions:
        if a["action"] == "drain" and a["event_id"] in sent:
            out.append(a["time"] - sent[a["event_id"]])
    return out


# ------------------------------------------------------------------------------ status and drains


@dataclass
class Reads:
    cli: dict[str, list[float]] = field(default_factory=lambda: {"status": [], "drains": []})
    http: dict[str, list[float]] = field(default_factory=lambda: {"status": [], "drains": []})
    errors: int = 0


_PATHS = {"status": "/api/v1/status", "drains": "/api/v1/drains"}


def read_views(url: str, every_s: float, out: Reads, stop: threading.Event) -> None:
    env = {**os.environ, "WATCHD_TOKEN": TOKEN}
    host, port = url.removeprefix("http://").split(":")
    while not stop.is_set():
        for what in ("status", "drains"):
            t0 = time.monotonic()
            done = subprocess.run(
                [*watchd_command(), what, "--url", url], env=env, capture_output=True, timeout=120
            )
            if done.returncode == 0:
                out.cli[what].append(time.monotonic() - t0)
            else:
                out.errors += 1
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            t0 = time.monotonic()
            try:
                conn.request("GET", _PATHS[what], headers={"Authorization": f"Bearer {TOKEN}"})
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    out.http[what].append(time.monotonic() - t0)
                else:
                    out.errors += 1
            except (OSError, http.client.HTTPException):
                out.errors += 1
            finally:
                conn.close()
        stop.wait(every_s)


@contextlib.contextmanager
def background(*targets: tuple[Any, ...]) -> Iterator[threading.Event]:
    stop = threading.Event()
    threads = [threading.Thread(target=t[0], args=(*t[1:], stop), daemon=True) for t in targets]
    for t in threads:
        t.start()
    try:
        yield stop
    finally:
        stop.set()
        for t in threads:
            t.join(180)


# ----------------------------------------------------------------------------------------- phases


def _ms(values: list[float], q: float) -> float:
    return pct(values, q) * 1000 if values else float("nan")


def idle_phase(engine: Daemon, nodes: int, xids: int, gap_s: float, first: int = 0) -> dict[str, Any]:
    inj = Injections()
    reads = Reads()
    targets = [node_name(i) for i in range(first, first + nodes, max(1, nodes // (2 * xids)))][:xids]
    with background((read_views, engine.url, 2.0, reads)) as stop:
        inject_xids(engine.url, targets, gap_s, inj, threading.Event())
        stop.set()
    time.sleep(0.5)
    lat = decisions(engine.url, inj.sent)
    return {
        "xid_decision_s": lat,
        "xid_reply_s": inj.reply_s,
        "xid_missing": len(inj.sent) - len(lat),
        "xid_errors": inj.errors,
        "xid_sent": inj.sent,
        "reads": reads,
    }


def load_phase(
    engine: Daemon, plan: Plan, xids: int, gap_s: float, nodes_offset: int, run: Run | None = None
) -> dict[str, Any]:
    """Under the plan's load (``run``: its generator, already started; by default started here)."""
    pid = engine.proc.pid
    run = run or Run(plan)
    inj = Injections()
    reads = Reads()
    step = max(1, plan.nodes // (2 * xids))
    targets = [node_name(i) for i in range(plan.first + nodes_offset, plan.first + plan.nodes, step)]
    try:
        time.sleep(max(0.0, run.measure_from - time.time()))
        m0 = Metrics(engine.url)
        c0, t0 = proc_cpu_s(pid), time.monotonic()
        rss: list[float] = []
        xid_gap = min(gap_s, plan.duration_s * 0.8 / max(1, xids))
        with background(
            (inject_xids, engine.url, targets[:xids], xid_gap, inj),
            (read_views, engine.url, max(5.0, plan.duration_s / 6), reads),
        ):
            while time.time() < run.measure_to:
                time.sleep(min(1.0, max(0.0, run.measure_to - time.time())))
                rss.append(proc_mem_mib(pid).get("VmRSS", float("nan")))
        c1, t1 = proc_cpu_s(pid), time.monotonic()
        m1 = Metrics(engine.url)
        mem = proc_mem_mib(pid)
        report = run.result()
    finally:
        run.stop()
    time.sleep(0.5)
    lat = decisions(engine.url, inj.sent)
    cycles = m1.get("watchd_detector_cycle_seconds_count") - m0.get("watchd_detector_cycle_seconds_count")
    cycle_s = m1.get("watchd_detector_cycle_seconds_sum") - m0.get("watchd_detector_cycle_seconds_sum")
    buckets = {le: v - m0.age_buckets.get(le, 0.0) for le, v in m1.age_buckets.items()}
    lag = {le: v - m0.lag_buckets.get(le, 0.0) for le, v in m1.lag_buckets.items()}
    drops = {
        **{f"ingest refused: {k}": v - m0.rejected.get(k, 0.0) for k, v in m1.rejected.items()},
        "invalid events": m1.get("watchd_events_invalid_total") - m0.get("watchd_events_invalid_total"),
        **{f"fleet evicted: {k}": v - m0.evicted.get(k, 0.0) for k, v in m1.evicted.items()},
    }
    return {
        "engine_cpu_cores": (c1 - c0) / (t1 - t0),
        "engine_rss_mib": mem.get("VmRSS"),
        "engine_rss_max_mib": max(rss, default=float("nan")),
        "engine_peak_rss_mib": mem.get("VmHWM"),
        "cycles": cycles,
        "cycle_mean_s": cycle_s / cycles if cycles else float("nan"),
        "cycle_longest_slice_s": m1.get("watchd_detector_cycle_longest_slice_seconds"),
        "event_age_p50_s": quantile(buckets, 0.5),
        "event_age_p95_s": quantile(buckets, 0.95),
        "loop_lag_p50_s": quantile(lag, 0.5) if lag else float("nan"),
        "loop_lag_p99_s": quantile(lag, 0.99) if lag else float("nan"),
        "queue_depth_end": m1.get("watchd_engine_queue_depth"),
        # answered before their batch was evaluated (a backlog; the events were taken: not a drop)
        "ack_timeouts": m1.get("watchd_ingest_ack_timeouts_total")
        - m0.get("watchd_ingest_ack_timeouts_total"),
        "drops": {k: v for k, v in drops.items() if v},
        "xid_decision_s": lat,
        "xid_reply_s": inj.reply_s,
        "xid_missing": len(inj.sent) - len(lat),
        "xid_errors": inj.errors,
        "xid_sent": inj.sent,
        "reads": reads,
        "loadgen": report,
    }


def measure_store(store: str, args: argparse.Namespace, pg: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"watchd-100k-{store}-") as tmp:
        work = Path(tmp)
        pg_dsn = None
        if pg is not None:
            pg_dsn = (pg.dsn(pg.create_database()), pg.password_file)
        engine = start_engine(work, args.nodes, store, pg_dsn, args.lease if pg is not None else None)
        try:
            print(f"[{store}] idle: {args.xids} Xid 79 injections, status/drains reads", flush=True)
            idle = idle_phase(engine, args.nodes, args.xids, args.xid_gap)
            plan = Plan(engine.url, TOKEN, args.nodes, args.duration, args.warmup, args.procs)
            print(
                f"[{store}] load: {args.nodes:,} agents x 8 GPUs, warm-up {args.warmup:g} s, "
                f"measured {args.duration:g} s",
                flush=True,
            )
            load = load_phase(engine, plan, args.xids, args.xid_gap, 1)
        finally:
            code = engine.stop(timeout=60)
        tracebacks = engine.log_path.read_text(errors="replace").count("Traceback")
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(engine.log_path, args.logs / f"engine-{store}-{args.nodes}.log")
        return {"store": store, "idle": idle, "load": load, "exit_code": code, "tracebacks": tracebacks}


# ----------------------------------------------------------------------------------------- report


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    idle, load = r["idle"], r["load"]
    lg: Report = load["loadgen"]
    f = lg.figures()
    idle_p99 = _ms(idle["xid_decision_s"], 0.99)
    load_p99 = _ms(load["xid_decision_s"], 0.99)
    out = {
        "store": r["store"],
        "engine_cpu_cores": round(load["engine_cpu_cores"], 3),
        "engine_rss_mib": round(load["engine_rss_mib"] or float("nan"), 1),
        "engine_peak_rss_mib": round(load["engine_peak_rss_mib"] or float("nan"), 1),
        "events_per_s": f["events_per_s"],
        "ingest_lag_p50_s": f["lag_p50_s"],
        "ingest_lag_p95_s": f["lag_p95_s"],
        "ingest_lag_floor_p50_s": f["floor_lag_p50_s"],
        "ingest_lag_floor_p95_s": f["floor_lag_p95_s"],
        "event_age_at_arrival_p50_s": round(load["event_age_p50_s"], 3),
        "event_age_at_arrival_p95_s": round(load["event_age_p95_s"], 3),
        "loop_lag_p50_s": round(load["loop_lag_p50_s"], 4),
        "loop_lag_p99_s": round(load["loop_lag_p99_s"], 4),
        "detector_cycle_mean_s": round(load["cycle_mean_s"], 3),
        "detector_cycles": load["cycles"],
        "detector_longest_slice_s": round(load["cycle_longest_slice_s"], 3),
        "xid_idle_p50_ms": round(_ms(idle["xid_decision_s"], 0.5), 1),
        "xid_idle_p99_ms": round(idle_p99, 1),
        "xid_load_p50_ms": round(_ms(load["xid_decision_s"], 0.5), 1),
        "xid_load_p99_ms": round(load_p99, 1),
        "xid_p99_ratio": round(load_p99 / idle_p99, 2) if idle_p99 else float("nan"),
        "xid_n": [len(idle["xid_decision_s"]), len(load["xid_decision_s"])],
        "xid_missing": [idle["xid_missing"], load["xid_missing"]],
        "xid_reply_load_p99_ms": round(_ms(load["xid_reply_s"], 0.99), 1),
        "engine_drops": load["drops"],
        "queue_depth_end": load["queue_depth_end"],
        "ack_timeouts": load["ack_timeouts"],
        "loadgen": f,
        "tracebacks": r["tracebacks"],
    }
    for what in ("status", "drains"):
        for how in ("cli", "http"):
            i = idle["reads"].__dict__[how][what]
            x = load["reads"].__dict__[how][what]
            out[f"{what}_{how}_idle_median_s"] = round(statistics.median(i), 3) if i else float("nan")
            out[f"{what}_{how}_load_median_s"] = round(statistics.median(x), 3) if x else float("nan")
            out[f"{what}_{how}_load_max_s"] = round(max(x), 3) if x else float("nan")
    out["nothing_dropped"] = (
        not load["drops"] and f["complete"] and load["xid_missing"] == 0 and idle["xid_missing"] == 0
    )
    out["goal_one_core"] = out["engine_cpu_cores"] <= 1.0
    out["goal_xid_2x"] = out["xid_p99_ratio"] <= 2.0
    return out


def print_summary(s: dict[str, Any]) -> None:
    lg = s["loadgen"]
    print(f"\n== {s['store']}: {lg['nodes']:,} agents, {lg['gpus']:,} GPUs, measured {lg['measured_s']} s")
    print(
        f"  engine      CPU {s['engine_cpu_cores']:.3f} cores (goal <= 1: "
        f"{'met' if s['goal_one_core'] else 'NOT met'}), RSS {s['engine_rss_mib']:.0f} MiB "
        f"(peak {s['engine_peak_rss_mib']:.0f})"
    )
    print(
        f"  ingest      {lg['events_per_s']:,.0f} events/s; lag (event time -> evaluated reply) "
        f"p50 {s['ingest_lag_p50_s']:.2f} s, p95 {s['ingest_lag_p95_s']:.2f} s; floor (the agent's own "
        f"delay) p50 {s['ingest_lag_floor_p50_s']:.2f} s, p95 {s['ingest_lag_floor_p95_s']:.2f} s"
    )
    print(
        "              event age at arrival (engine histogram) "
        f"p50 ~{s['event_age_at_arrival_p50_s']:.2f} s, "
        f"p95 ~{s['event_age_at_arrival_p95_s']:.2f} s; request round trip p50 {lg['rtt_p50_s']:.3f} s, "
        f"p95 {lg['rtt_p95_s']:.3f} s"
    )
    print(
        f"  detectors   cycle {s['detector_cycle_mean_s']:.3f} s computing "
        f"(mean of {s['detector_cycles']:.0f}),"
        f" longest slice {s['detector_longest_slice_s']:.3f} s;"
        f" event loop lag p50 ~{s['loop_lag_p50_s']:.3f} s, p99 ~{s['loop_lag_p99_s']:.3f} s"
    )
    print(
        f"  Xid->drain  idle p50 {s['xid_idle_p50_ms']:.1f} ms p99 {s['xid_idle_p99_ms']:.1f} ms "
        "(the floor); "
        f"under load p50 {s['xid_load_p50_ms']:.1f} ms p99 {s['xid_load_p99_ms']:.1f} ms = "
        f"{s['xid_p99_ratio']:.2f}x idle (goal <= 2x: {'met' if s['goal_xid_2x'] else 'NOT met'}); "
        f"n {s['xid_n']}, missing {s['xid_missing']}"
    )
    for what in ("status", "drains"):
        print(
            f"  {what:<11} CLI idle {s[f'{what}_cli_idle_median_s']:.3f} s, load median "
            f"{s[f'{what}_cli_load_median_s']:.3f} s max {s[f'{what}_cli_load_max_s']:.3f} s; HTTP GET idle "
            f"{s[f'{what}_http_idle_median_s']:.3f} s, load median {s[f'{what}_http_load_median_s']:.3f} s "
            f"max {s[f'{what}_http_load_max_s']:.3f} s"
        )
    print(
        f"  dropped     engine {s['engine_drops'] or 'none'}; queue at end {s['queue_depth_end']:.0f}, "
        f"replies before evaluation (ack timeouts) {s['ack_timeouts']:.0f}; "
        f"generator: {lg['undelivered_at_end']} windows undelivered, {lg['dropped_events']} events refused, "
        f"{lg['timeouts']} timeouts, statuses {lg['statuses']} -> "
        f"{'nothing dropped' if s['nothing_dropped'] else 'NOT CLEAN'}"
    )
    print(
        f"  generator   {lg['cpu_cores']:.3f} cores in {lg['procs']} processes, behind schedule p99 "
        f"{lg['behind_p99_s']:.3f} s max {lg['behind_max_s']:.3f} s"
        + (" -> NOT A MEASUREMENT (it fell behind)" if lg["behind"] else " (kept to schedule)")
        + f"; windows deferred by the engine {lg['deferred_windows']:,}"
    )


def arguments(description: str | None = __doc__) -> argparse.ArgumentParser:
    """The options of this benchmark (scale_shards.py adds ``--shards``)."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=12_500, help="agents of 8 GPUs (default 12,500)")
    ap.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--duration", type=float, default=90.0, help="measured seconds under load")
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--procs", type=int, default=2, help="load generator processes")
    ap.add_argument("--xids", type=int, default=60, help="Xid 79 injections per phase")
    ap.add_argument("--xid-gap", type=float, default=1.0, help="seconds between injections (about)")
    ap.add_argument(
        "--lease", help="PostgreSQL: elect a leader through this lease (a shard of several engines)"
    )
    ap.add_argument("--quick", action="store_true", help="500 nodes, SQLite, 20 s: a smoke run (REDUCED)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--logs", type=Path, help="keep the engine's log (warnings and errors) in this folder")
    return ap


def prepare(args: argparse.Namespace, shards: bool = False) -> list[str]:
    """``--quick``'s sizes applied and the run printed; the stores to measure (shards: PostgreSQL)."""
    if args.quick:
        args.nodes, args.store, args.duration, args.warmup, args.xids, args.xid_gap = (
            500,
            "sqlite",
            20.0,
            8.0,
            15,
            0.3,
        )
    stores = ["postgres"] if shards else ["sqlite", "postgres"] if args.store == "both" else [args.store]
    print(
        f"scale benchmark{' (REDUCED SIZE: --quick)' if args.quick else ''}: {args.nodes:,} agents x 8 GPUs, "
        f"stores {stores}, {os.cpu_count()} cores on this machine (shared), engine, load generator and "
        "probes on the same machine"
    )
    print(
        "engine config: shipped defaults but mode enforce + the in-memory scheduler (fake) with the fleet's "
        "nodes (a drain decided through the whole pipeline, no Slurm here), safety.max_nodes 1000 (default "
        "50/h: the injections would be held past it), slurm disabled"
    )
    return stores


def main() -> int:
    args = arguments().parse_args()
    stores = prepare(args)
    results = []
    for store in stores:
        if store == "postgres":
            from tests.harness.postgres import PostgresServer, available

            ok, why = available()
            if not ok:
                print(f"[postgres] skipped: {why}")
                continue
            with PostgresServer() as pg:
                results.append(summarize(measure_store(store, args, pg)))
        else:
            results.append(summarize(measure_store(store, args, None)))
        print_summary(results[-1])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    behind = any(r["loadgen"]["behind"] for r in results)
    if behind:
        print("\nNOT A MEASUREMENT: the load generator fell behind its schedule (see 'generator' above)")
    return 1 if behind or not results else 0


if __name__ == "__main__":
    raise SystemExit(main())
