"""The job-heartbeat path's cost: on the training loop's thread, and in the agent.

1. Client: microseconds per ``Heartbeat.step()`` on the calling thread (a tight loop), with a real agent
   listening on its Unix socket and with no agent at all; the floor, in the same run, is a loop that appends
   a small dict to a bounded ``collections.deque``. Then a rank paced at 100 and at 10,000 steps/s for 5 s:
   reports delivered vs. dropped (``hb.dropped``) and requests made (one per ``send_interval``, 0.5 s, at
   most; beyond 128 steps/s the queue of 64 drops its oldest reports, by design).
2. Agent: a real ``watchd agent`` (fake GPU backend, healthy_training.yaml, heartbeat on its Unix socket)
   ships to a real ``watchd engine`` (dry-run) while N ranks (real ``watchd.client.Heartbeat`` objects, one
   thread each) report at 1 and 10 steps/s for --seconds. The floor/peer is the same agent with heartbeat
   disabled, running in the same windows: CPU (% of one core, /proc/<pid>/stat) and RSS of both, reports
   accepted (``watchd_agent_heartbeats_total{outcome="accepted"}``) and heartbeat events forwarded to and
   received by the engine (at most one per rank per forward_interval_s, 2 s).
3. Endpoint: max reports/s from one burst client posting batches of 256 over the Unix socket.
Run: ``.venv/bin/python benchmarks/heartbeat_cost.py`` (--quick: 5 s windows).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.agent_cost import cpu_seconds, rss_mib  # noqa: E402
from benchmarks.common import table  # noqa: E402
from tests.daemons import Daemon, agent_config, engine_config, free_port  # noqa: E402
from watchd.client import Heartbeat  # noqa: E402

SCENARIO = ROOT / "tests" / "gpu_scenarios" / "healthy_training.yaml"


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` carrying all ``labels`` in a Prometheus text exposition."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        head = line[len(name) : len(name) + 1]
        if line.startswith(name) and head in ("{", " ") and all(w in line for w in want):
            total += float(line.split()[-1])
    return total


def delta(before: str, after: str, name: str, **labels: str) -> float:
    return metric(after, name, **labels) - metric(before, name, **labels)


def per_call_us(one: Any, n: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for i in range(n):
            one(i)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def paced(hb: Heartbeat, rate: float, seconds: float, stop: threading.Event) -> int:
    """Steps at ``rate`` per second (in slices of at most 10 ms) until ``seconds`` pass; the count."""
    t0, i = time.monotonic(), 0
    chunk = max(1, int(rate / 100))
    while not stop.is_set():
        elapsed = time.monotonic() - t0
        if elapsed >= seconds:
            break
        due = int(elapsed * rate) + 1
        while i < due:
            i += 1
            hb.step(i, collective_seq=i, compute_time=0.01)
        time.sleep(max(0.0, (i + chunk - 1) / rate - (time.monotonic() - t0)))
    return i


def tail_us(one: Any, n: int) -> tuple[float, float]:
    """p99 and max of ``n`` single calls timed one by one (a GIL hand-off to the sender shows here)."""
    times = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        one(i)
        times.append(time.perf_counter_ns() - t0)
    times.sort()
    return times[int(n * 0.99)] / 1000, times[-1] / 1000


def client_cost(sock: Path, calls: int, stop: threading.Event) -> None:
    q: collections.deque[dict[str, Any]] = collections.deque(maxlen=64)
    dead = Heartbeat(
        "bench-noagent", 0, socket_path=f"{sock}.none", port=free_port(), report_done_at_exit=False
    )
    live = Heartbeat("bench-client", 0, socket_path=str(sock), report_done_at_exit=False)
    cases: list[tuple[str, Any]] = [("floor: dict onto a deque(maxlen=64)", lambda i: q.append({"step": i}))]
    for label, hb in (("hb.step(), agent listening", live), ("hb.step(), no agent", dead)):
        cases.append((label, lambda i, hb=hb: hb.step(i, collective_seq=i, compute_time=0.01)))
    rows, base = [], 0.0
    for label, one in cases:
        us = per_call_us(one, calls)
        base = base or us
        p99, worst = tail_us(one, calls)
        rows.append([label, f"{us:.2f}", f"{us / base:.1f}x", f"{p99:.1f}", f"{worst:,.0f}"])
    for hb in (live, dead):
        hb.close()
    print(f"\n1. client, calling thread: {calls:,} calls in a tight loop, best of 3 ({os.cpu_count()} cores)")
    print(table(["loop", "us per call", "vs floor", "p99 us", "max us"], rows))
    seconds, rows = 5.0, []
    for label, path, pace in (
        ("agent listening", str(sock), 100),
        ("agent listening", str(sock), 10_000),
        ("no agent", f"{sock}.none", 10_000),
    ):
        hb = Heartbeat("bench-rate", 1, socket_path=path, port=free_port(), report_done_at_exit=False)
        n = paced(hb, pace, seconds, stop)
        hb.close(timeout=2.0)
        cells = (
            f"{n:,}",
            f"{n / seconds:,.0f}",
            f"{hb.sent:,}",
            f"{hb.dropped:,}",
            f"{hb.dropped / (n + 1):.1%}",
            f"{hb.requests / seconds:,.1f}",
        )
        rows.append([label, *cells])
    print(f"\n   one rank paced for {seconds:g} s (queue 64, one request per 0.5 s at most)")
    print(table(["case", "steps", "steps/s", "delivered", "dropped", "dropped %", "requests/s"], rows))


def run_ranks(
    sock: Path, job: str, ranks: int, rate: float, seconds: float, stop: threading.Event
) -> list[Heartbeat]:
    hbs = [
        Heartbeat(job, r, local_rank=r % 8, gpu=r % 8, socket_path=str(sock), report_done_at_exit=False)
        for r in range(ranks)
    ]
    threads = [threading.Thread(target=paced, args=(hb, rate, seconds, stop), daemon=True) for hb in hbs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for hb in hbs:
        hb.close()
    return hbs


def agent_cost(
    sock: Path, hb_agent: Daemon, peer: Daemon, engine: Daemon, seconds: float, stop: threading.Event
) -> None:
    rows = []
    for ranks, rate in ((8, 1.0), (8, 10.0), (64, 1.0), (64, 10.0)):
        m0, e0 = hb_agent.get("/metrics"), engine.get("/metrics")
        c0 = [cpu_seconds(d.proc.pid) for d in (hb_agent, peer)]
        t0 = time.monotonic()
        hbs = run_ranks(sock, f"job-{ranks}x{rate:g}", ranks, rate, seconds, stop)
        elapsed = time.monotonic() - t0
        c1 = [cpu_seconds(d.proc.pid) for d in (hb_agent, peer)]
        time.sleep(0.5)  # the engine gets the last shipments
        m1, e1 = hb_agent.get("/metrics"), engine.get("/metrics")
        if stop.is_set():
            return
        cpu = [(b - a) / elapsed * 100 for a, b in zip(c0, c1, strict=True)]
        hb_ev = {"source": "heartbeat", "kind": "heartbeat"}
        accepted = delta(m0, m1, "watchd_agent_heartbeats_total", outcome="accepted")
        forwarded = delta(m0, m1, "watchd_agent_events_total", **hb_ev)
        received = delta(e0, e1, "watchd_events_received_total", **hb_ev)
        sent, dropped = sum(h.sent for h in hbs), sum(h.dropped for h in hbs)
        rss = f"{rss_mib(hb_agent.proc.pid):.1f} / {rss_mib(peer.proc.pid):.1f}"
        ratio = f"{cpu[0] - cpu[1]:+.2f} ({cpu[0] / max(cpu[1], 0.01):.1f}x)"
        rows.append([f"{ranks} ranks x {rate:g}/s", f"{cpu[0]:.2f}", f"{cpu[1]:.2f}", ratio, rss])
        rows[-1] += [
            f"{accepted / elapsed:,.0f}",
            f"{sent:,}/{dropped:,}",
            f"{forwarded:,.0f} / {received:,.0f}",
        ]
        rows[-1].append(f"{forwarded / elapsed:.1f}")
    print(f"\n2. agent, {seconds:g} s per row; peer = the same agent with heartbeat disabled, same windows")
    heads = ["ranks", "CPU % hb", "CPU % peer", "hb - peer", "RSS MiB hb/peer", "accepted/s"]
    print(table([*heads, "client sent/dropped", "fwd / engine rcvd", "fwd/s"], rows))


def burst(sock: Path, seconds: float) -> None:
    conn = http.client.HTTPConnection("localhost", timeout=5)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(str(sock))
    conn.sock = raw
    reports = requests = step = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        step += 1
        now = time.time()
        body = [{"job": "burst", "rank": r, "step": step, "time": now} for r in range(256)]
        conn.request(
            "POST", "/v1/heartbeat", body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
        reports, requests = reports + len(body), requests + 1
    elapsed = time.monotonic() - t0
    conn.close()
    print(f"\n3. endpoint, one client posting batches of 256 over the Unix socket for {elapsed:.1f} s")
    row = [f"{reports / elapsed:,.0f}", f"{requests / elapsed:,.1f}", f"{elapsed / requests * 1000:.2f}"]
    print(table(["reports/s", "requests/s", "ms per request"], [row]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0, help="per agent scenario (default 30)")
    p.add_argument("--quick", action="store_true", help="5 s per scenario")
    args = p.parse_args()
    seconds = 5.0 if args.quick else args.seconds
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    with tempfile.TemporaryDirectory(prefix="watchd-hb-cost-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        sock = work / "hb.sock"
        token = work / "token"
        token.write_text("bench\n")
        try:
            engine_cfg = engine_config(free_port(), token, "dry-run", None)
            engine_cfg["log"] = {"level": "warning", "format": "json"}
            engine = Daemon("engine", engine_cfg, work)
            stack.callback(engine.stop)
            engine.wait_ready()
            agents = []
            for i, enabled in enumerate((True, False)):
                cfg = agent_config(f"gpu-node-{i + 1}", engine.port, token, work / "unused.log")
                cfg["sources"] = {
                    "kmsg": {"enabled": False},
                    "gpu": {"backend": "fake", "scenario": str(SCENARIO)},
                }
                # the cost of the path, not who may report (docs/security.md): unverified
                cfg["heartbeat"] = {"enabled": enabled, "socket": str(sock), "http_port": 0, "verify": False}
                cfg["log"] = {"level": "warning", "format": "json"}
                agents.append(Daemon("agent", cfg, work))
                stack.callback(agents[-1].stop)
            for agent in agents:
                agent.wait_ready()
            time.sleep(3)  # past start-up (imports, first rounds)
            client_cost(sock, 20_000 if args.quick else 100_000, stop)
            agent_cost(sock, agents[0], agents[1], engine, seconds, stop)
            burst(sock, min(seconds, 5.0))
        except KeyboardInterrupt:
            stop.set()
            print("\ninterrupted: stopping the daemons", file=sys.stderr)
            return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
