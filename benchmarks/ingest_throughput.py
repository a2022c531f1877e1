"""HTTP ingest throughput, end to end: events/second a real ``watchd engine`` process accepts over HTTP.

The engine runs as its own process (``watchd engine --config``: dry-run, Slurm disabled, log level warning,
a rules file that matches nothing by default, or the rule pack with --rules pack). This process sends
--events events per batch size, pre-serialised (the wire format of ``batch_to_wire``), over --connections
concurrent aiohttp connections; a 503 (queue full) is retried after a short pause and counted. Figures:
accepted events/s (first request to last 200), drained events/s (until the engine's queue depth is 0),
engine CPU seconds per 1,000 events (/proc/<pid>/stat), and the ``watchd_events_received_total`` delta from
the engine's /metrics, which must equal the events sent. The floor: the same requests, same client, against
a trivial aiohttp server process that only reads the body. Run: ``.venv/bin/python
benchmarks/ingest_throughput.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import make_events, table  # noqa: E402
from tests.daemons import Daemon, engine_config, free_port  # noqa: E402
from watchd.model.events import INGEST_PATH, batch_to_wire  # noqa: E402

TARGET = 20_000  # accepted events/s
TOKEN = "bench-token"
NOTHING = """rules:
  - name: bench-matches-nothing
    match: {kind: bench-never}
    actions: [log]
"""
FLOOR_SERVER = """
import sys
from aiohttp import web

async def ingest(request):
    body = await request.read()
    return web.json_response({"accepted": len(body)})

async def healthz(request):
    return web.json_response({"status": "ok"})

app = web.Application(client_max_size=64 * 1024 * 1024)
app.router.add_post(sys.argv[2], ingest)
app.router.add_get("/healthz", healthz)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metrics(url: str) -> tuple[float, float]:
    """Events received (all labels) and the queue depth, from the engine's /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    received, depth = 0.0, 0.0
    for line in text.splitlines():
        if line.startswith("watchd_events_received_total"):
            received += float(line.rsplit(" ", 1)[1])
        elif line.startswith("watchd_engine_queue_depth"):
            depth = float(line.rsplit(" ", 1)[1])
    return received, depth


@dataclass
class Result:
    target: str
    batch: int
    events: int
    accept_s: float
    drain_s: float
    cpu_s: float
    retries: int
    rejected: int = 0
    confirmed: int | None = None


async def send_all(url: str, bodies: list[bytes], connections: int) -> tuple[float, int, dict[str, int]]:
    """POST every body over ``connections`` concurrent connections; seconds until the last is answered,
    how many 503s were retried, and the batches refused otherwise (by error message)."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    retries = 0
    refused: dict[str, int] = {}
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal retries
        while not queue.empty():
            body = queue.get_nowait()
            while True:
                async with session.post(url + INGEST_PATH, data=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status == 200:
                        break
                    if resp.status != 503:
                        error = (await resp.text())[:60]
                        refused[error] = refused.get(error, 0) + 1
                        break
                retries += 1
                await asyncio.sleep(0.02)

    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(connections)))
        return time.perf_counter() - t0, retries, refused


def bodies_for(events_n: int, batch: int, run: str) -> list[bytes]:
    events = make_events(events_n, id_prefix=f"{run}-")
    out = []
    for i in range(0, len(events), batch):
        part = events[i : i + batch]
        nodes = {e.node for e in part}
        out.append(json.dumps(batch_to_wire(part[0].node if len(nodes) == 1 else "bench", part)).encode())
    return out


def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} not ready in {timeout}s")


def run_engine(
    work: Path, bodies: list[bytes], events_n: int, batch: int, args: argparse.Namespace
) -> Result:
    token_file = work / "token"
    token_file.write_text(TOKEN + "\n")
    rules = ROOT / "rules" if args.rules == "pack" else work / "nothing.yaml"
    if args.rules != "pack":
        rules.write_text(NOTHING)
    cfg = engine_config(free_port(), token_file, "dry-run", None)
    cfg["rules"] = [str(rules)]
    cfg["default_rules"] = args.rules == "pack"  # "nothing": that rule alone, not beside the embedded pack
    cfg["log"] = {"level": "warning", "format": "json"}
    cfg["reload"] = {"watch_files": False}
    cfg["ingest"] = {"max_body_bytes": 64 * 1024 * 1024, "max_events_per_batch": 10_000}
    engine = Daemon("engine", cfg, work)
    try:
        engine.wait_ready()
        received0, _ = metrics(engine.url)
        cpu0 = cpu_seconds(engine.proc.pid)
        accept_s, retries, refused = asyncio.run(send_all(engine.url, bodies, args.connections))
        for error, n in refused.items():
            print(f"  !!! batch {batch}: {n} of {len(bodies)} batches refused: {error}", file=sys.stderr)
        lost = sum(refused.values()) * batch
        t_accepted = time.perf_counter()
        while True:
            received, depth = metrics(engine.url)
            if depth == 0 and received - received0 >= events_n - lost:
                break
            if time.perf_counter() - t_accepted > 120:
                raise RuntimeError(f"engine did not drain: depth {depth}, received {received - received0}")
            time.sleep(0.01)
        drain_s = accept_s + time.perf_counter() - t_accepted
        cpu = cpu_seconds(engine.proc.pid) - cpu0
        result = Result("watchd engine", batch, events_n, accept_s, drain_s, cpu, retries, lost)
        result.confirmed = int(received - received0)
        return result
    finally:
        engine.stop()


def run_floor(bodies: list[bytes], events_n: int, batch: int, connections: int) -> Result:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", FLOOR_SERVER, str(port), INGEST_PATH])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url)
        cpu0 = cpu_seconds(proc.pid)
        accept_s, retries, refused = asyncio.run(send_all(url, bodies, connections))
        cpu = cpu_seconds(proc.pid) - cpu0
        lost = sum(refused.values()) * batch
        return Result("floor: aiohttp, read body", batch, events_n, accept_s, accept_s, cpu, retries, lost)
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=200_000, help="events per batch size")
    p.add_argument("--batch", type=int, nargs="+", default=[20, 100, 1000, 5000])
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--rules", choices=["nothing", "pack"], default="nothing")
    args = p.parse_args()

    results: list[Result] = []
    payload: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="watchd-ingest-") as tmp:
        work = Path(tmp)
        for batch in args.batch:
            bodies = bodies_for(args.events, batch, f"b{batch}")
            payload[batch] = sum(len(b) for b in bodies) / args.events
            results.append(run_floor(bodies, args.events, batch, args.connections))
            results.append(run_engine(work, bodies, args.events, batch, args))
            r = results[-1]
            print(f"  ... batch {batch}: {r.events / r.accept_s:,.0f} events/s accepted", file=sys.stderr)

    rules = "the pack in rules/" if args.rules == "pack" else "one that matches nothing"
    print(
        f"\nwatchd HTTP ingest, engine as a separate process ({os.cpu_count()} shared cores; client, engine "
        f"and floor server on the same machine), {args.connections} connections, {args.events:,} events "
        f"per batch size, rules: {rules}"
    )
    sizes = ", ".join(f"{b:,}: {payload[b] / 1024 * b:,.0f} KiB" for b in args.batch)
    print(f"  wire size: {payload[args.batch[0]]:,.0f} bytes/event; a batch of {sizes}\n")
    floors = {r.batch: r for r in results if r.target.startswith("floor")}
    body = []
    for r in results:
        floor = floors[r.batch]
        is_floor = r is floor
        body.append(
            [
                r.target,
                f"{r.batch:,}",
                f"{(r.events - r.rejected) / r.accept_s:,.0f}",
                "-" if is_floor else f"{(r.events - r.rejected) / r.drain_s:,.0f}",
                "-" if is_floor else f"{r.accept_s / floor.accept_s:.1f}x",
                f"{r.cpu_s:.2f}",
                f"{r.cpu_s / r.events * 1000 * 1000:.1f}",
                str(r.retries),
                f"{r.rejected:,}",
                "-" if r.confirmed is None else f"{r.confirmed:,}",
            ]
        )
    heads = ["server", "batch", "accepted/s", "drained/s", "vs floor", "CPU s", "CPU ms/1k ev", "503s"]
    print(table([*heads, "refused ev", "metrics count"], body))
    print()
    for r in results:
        if r.confirmed is None:
            continue
        got = (r.events - r.rejected) / r.accept_s
        seen = f"{r.confirmed:,} of {r.events:,} sent {'(all)' if r.confirmed == r.events else '(NOT ALL)'}"
        print(
            f"  batch {r.batch:>5,}: {got:,.0f} accepted events/s -> target >= {TARGET:,}: "
            f"{'met' if got >= TARGET else 'MISSED'} ({got / TARGET:.2f}x); "
            f"/metrics confirms {seen}, queue drained"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
