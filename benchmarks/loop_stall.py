"""Event-loop stalls at 100,000 nodes and 100,000 jobs (fault round, finding 7; docs/fault-suite.md).

The fleet: ``--nodes`` nodes (100,000) of one GPU, each running its own job as the agents label it (100,000
jobs), ``--windows`` 5 s summary windows each (8: past the hang detector's 30 s warm-up).

1. In this process (the default): the engine's own subsystems, ``Detectors`` (watchd/detect/service.py) and
   ``Reliability`` (watchd/reliability/subsystem.py: every node's interval in an on-disk state database,
   2,000 failures), and an aiohttp server on loopback with their routes and a ``/healthz``. A probe task
   sleeps 10 ms at a time and records how late it wakes: the loop's longest stall. A thread GETs
   ``/healthz`` every 10 ms, another ``GET /api/v1/reliability`` every second (``?since=30d`` every
   third). Measured over ``--cycles`` detector cycles, one reliability cycle and one fleet prune, twice in
   the same run: as the engine does them (sliced, the report served from its cache) and, as the floor, the
   same work done blocking the loop, as before (``Correlator.run`` and ``FleetState.prune`` at once, the
   report built on the loop per request, the reliability cycle's blocking form).
2. ``--engine``: a real ``watchd engine`` process fed the same fleet over HTTP (dry-run, the shipped
   rules; ``jobs.member_ttl_s`` and ``detectors.history_s`` raised so the fed state lasts the measurement),
   then for ``--duration`` seconds /healthz every 10 ms, ``GET /api/v1/reliability`` every 2 s and a
   200-event ingest batch every second, from outside. The engine runs the code on ``PYTHONPATH``: point it
   at another checkout for that checkout's figure (the before figure).

Run: ``.venv/bin/python benchmarks/loop_stall.py [--engine]`` (about 2 min; 5 more with --engine).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aiohttp import web  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from benchmarks.common import table  # noqa: E402
from watchd.clock import FakeClock  # noqa: E402
from watchd.detect.params import DetectorsConfig  # noqa: E402
from watchd.detect.service import Detectors  # noqa: E402
from watchd.httputil import json_response  # noqa: E402
from watchd.jobs.settings import JobsConfig  # noqa: E402
from watchd.model.events import Event  # noqa: E402
from watchd.reliability.settings import ReliabilityConfig  # noqa: E402
from watchd.reliability.subsystem import Reliability  # noqa: E402
from watchd.store.database import Store  # noqa: E402

T0 = 1_760_000_000.0
WS = 5.0
TOKEN = "loop-stall-token"


def summary_attrs(n: int) -> dict[str, Any]:
    return {
        "gpu": 0,
        "model": "NVIDIA H100",
        "job": f"slurm:{n}",
        "util_mean": 97.0,
        "power_mean": 650.0,
        "sm_clock_mean": 1980.0,
        "nvlink_tx_mean": 1e9,
        "window_s": WS,
    }


# ------------------------------------------------------------------------------------------ measuring


@dataclass
class Probe:
    """The loop's longest stall (a 10 ms sleep's overshoot) and the latencies seen by the probing threads."""

    stall_s: float = 0.0
    healthz_s: list[float] = field(default_factory=list)
    reliability_s: list[float] = field(default_factory=list)
    errors: int = 0
    gc_full_s: float = 0.0  # CPython's longest full (generation 2) collection meanwhile
    gc_full: int = 0
    # each probe sleep: (start, end, the loop thread's CPU time meanwhile: what held the loop, not the
    # other processes of a loaded machine taking the core)
    sleeps: list[tuple[float, float, float]] = field(default_factory=list)
    gc_spans: list[tuple[float, float]] = field(default_factory=list)  # full ones on the loop's thread
    _gc_start: float = 0.0

    def gc_callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif info["generation"] == 2:
            end = time.perf_counter()
            self.gc_full += 1
            self.gc_full_s = max(self.gc_full_s, end - self._gc_start)
            if threading.get_ident() == threading.main_thread().ident:  # the loop's (a worker's GC waits
                self.gc_spans.append((self._gc_start, end))  # on the GIL: it shows in the wall stall)

    def stall_without_gc(self) -> float:
        """The most the loop's thread computed during one 10 ms probe sleep, less the full collections it
        ran meanwhile: the work's own hold on the loop, whatever else the machine runs."""
        return max(
            (
                cpu - sum(max(0.0, min(e, b) - max(s, a)) for s, e in self.gc_spans)
                for a, b, cpu in self.sleeps
            ),
            default=0.0,
        )

    def row(self, name: str, wall_s: float) -> list[str]:
        h = sorted(self.healthz_s) or [float("nan")]
        r = self.reliability_s or [float("nan")]
        return [
            name,
            f"{self.stall_s:.3f}",
            f"{self.stall_without_gc():.3f}",
            f"{h[-1]:.3f}",
            f"{h[int(0.99 * (len(h) - 1))]:.3f}",
            f"{statistics.median(r):.3f} / {max(r):.3f}",
            f"{self.gc_full} / {self.gc_full_s:.3f}",
            f"{wall_s:.1f}",
        ]


HEADER = [
    "form",
    "longest stall s",
    "loop CPU less full GC s",
    "/healthz max s",
    "p99 s",
    "reliability GET median / max s",
    "full GCs / longest s",
    "wall s",
]


def poll(url: str, path: str, every_s: float, out: list[float], stop: threading.Event, probe: Probe) -> None:
    """GET ``path`` every ``every_s`` until ``stop``, each one's latency into ``out``."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    i = 0
    while not stop.is_set():
        p = path.replace("{i}", "?since=30d" if i % 3 == 2 else "")
        i += 1
        t0 = time.perf_counter()
        try:
            conn.request("GET", p, headers=headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                probe.errors += 1
        except OSError:
            probe.errors += 1
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
        out.append(time.perf_counter() - t0)
        stop.wait(max(0.0, every_s - (time.perf_counter() - t0)))
    conn.close()


def start_pollers(
    url: str, probe: Probe, stop: threading.Event, reliability_every_s: float
) -> list[threading.Thread]:
    threads = [
        threading.Thread(target=poll, args=(url, "/healthz", 0.01, probe.healthz_s, stop, probe)),
        threading.Thread(
            target=poll,
            args=(url, "/api/v1/reliability{i}", reliability_every_s, probe.reliability_s, stop, probe),
        ),
    ]
    for t in threads:
        t.start()
    return threads


# ------------------------------------------------------------------------------------------ in process


def build_state(nodes: int, windows: int, tmp: Path) -> tuple[Detectors, Reliability, FakeClock, Store]:
    clock = FakeClock(start=T0 + WS * windows)

    async def emit(_: Event) -> None:
        return None

    detectors = Detectors(DetectorsConfig(), JobsConfig(), clock, CollectorRegistry(), emit)
    store = Store.open(tmp / "state.db")
    rel = Reliability(
        ReliabilityConfig(), store, clock, detectors.correlator.topology, lambda node: ["batch"]
    )
    for w in range(windows):
        t = T0 + WS * w
        for n in range(nodes):
            e = Event(f"{w}-{n}", f"node-{n:06d}", "nvml", "gpu_summary", t, summary_attrs(n))
            detectors.observe(e)
            rel.observe(e)
    rel.flush_now()
    for i in range(2_000):
        store.reliability.add_failure(
            T0 + i * 0.01, f"node-{i % nodes:06d}", "r", f"e{i}", "xid 79", 0, "enforce"
        )
    return detectors, rel, clock, store


async def scenario(
    detectors: Detectors, rel: Reliability, clock: FakeClock, cycles: int, blocking: bool
) -> tuple[Probe, float]:
    """``cycles`` detector cycles, a reliability cycle and a prune, with the probes running."""
    probe = Probe()
    app = web.Application()

    async def healthz(_: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    app.router.add_get("/healthz", healthz)
    if blocking:  # the route as it was: the report flushed, read and built on the loop per request

        async def old_document(_: web.Request) -> web.Response:
            report = rel.report(now=clock.now())
            return json_response(report.to_dict())

        app.router.add_get("/api/v1/reliability", old_document)
    else:
        rel.routes(app, lambda request: "bench")
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    done = asyncio.Event()

    async def lag() -> None:
        while not done.is_set():
            t0, c0 = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0.01)
            t1, c1 = time.perf_counter(), time.thread_time()
            probe.stall_s = max(probe.stall_s, t1 - t0 - 0.01)
            probe.sleeps.append((t0, t1, c1 - c0))

    stop = threading.Event()
    gc.callbacks.append(probe.gc_callback)
    lag_task = asyncio.create_task(lag())
    threads = start_pollers(f"http://127.0.0.1:{port}", probe, stop, 1.0)
    await asyncio.sleep(0.5)
    work: list[Callable[[], Awaitable[object]]] = []
    if blocking:

        async def detect_blocking() -> None:
            detectors.correlator.run(clock.now())

        async def cycle_blocking() -> None:
            rel.cycle_now()

        async def prune_blocking() -> None:
            detectors.correlator.prune(clock.now())

        work = [detect_blocking] * cycles + [cycle_blocking, prune_blocking]
    else:
        work = [detectors.detect] * cycles + [rel.cycle, detectors.prune]
    t0 = time.perf_counter()
    for job in work:
        await job()
        await asyncio.sleep(0.5)  # the engine runs them every few seconds: the loop idles between
    wall = time.perf_counter() - t0
    stop.set()
    for t in threads:
        await asyncio.to_thread(t.join)
    done.set()
    await lag_task
    gc.callbacks.remove(probe.gc_callback)
    await runner.cleanup()
    return probe, wall


def in_process(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="watchd-loop-stall-") as tmp:
        t0 = time.perf_counter()
        detectors, rel, clock, store = build_state(args.nodes, args.windows, Path(tmp))
        built_s = time.perf_counter() - t0
        print(f"state: {args.nodes:,} nodes and jobs x {args.windows} windows in {built_s:.1f} s")
        rows = []
        results = {}
        for blocking in (False, True):
            probe, wall = asyncio.run(scenario(detectors, rel, clock, args.cycles, blocking))
            results[blocking] = probe
            rows.append(
                probe.row("floor: blocking (as before)" if blocking else "sliced, report cached", wall)
            )
        after, floor = results[False], results[True]
        stats = detectors.last_cycle
        store.close()
    print(
        f"\nin process: {args.cycles} detector cycles, 1 reliability cycle, 1 fleet prune; "
        f"/healthz every 10 ms, GET /api/v1/reliability every 1 s\n"
    )
    print(table(HEADER, rows))
    print(
        f"\nstall ratio to the floor: {after.stall_s / floor.stall_s:.3f}; last cycle: {stats.busy_s:.2f} s "
        f"computing in {stats.slices} slices over {stats.wall_s:.2f} s, "
        f"the longest {stats.longest_s * 1000:.1f} ms; "
        f"reliability reports built: {rel.reports.builds}; errors {after.errors + floor.errors}"
    )


# ------------------------------------------------------------------------------------------ a real engine


def engine(args: argparse.Namespace) -> None:
    from tests.daemons import Daemon, engine_config, free_port

    with tempfile.TemporaryDirectory(prefix="watchd-loop-stall-engine-") as tmp:
        work = Path(tmp)
        (work / "token").write_text(TOKEN + "\n")
        config = engine_config(free_port(), work / "token", "dry-run", None)
        config.update(
            rules=[str(ROOT / "rules")],
            state={"path": str(work / "engine.db")},
            log={"level": "error", "format": "json"},
            jobs={"member_ttl_s": 3600},
            detectors={"history_s": 3600},
        )
        daemon = Daemon("engine", config, work)
        try:
            daemon.wait_ready()
            cut = feed(daemon.url, args.nodes, args.windows)
            figures = measure_engine(daemon.url, args.duration)
            figures["ingest batches cut while fed"] = str(cut)
        finally:
            daemon.stop()
    print(f"\nreal engine (its code: PYTHONPATH={os.environ.get('PYTHONPATH', '')!r}):\n")
    for k, v in figures.items():
        print(f"  {k:<40} {v}")


def post(conn: http.client.HTTPConnection, events: list[dict[str, Any]]) -> float:
    body = json.dumps({"version": 1, "node": "bench", "events": events}).encode()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    t0 = time.perf_counter()
    conn.request("POST", "/api/v1/events", body, headers)
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        raise RuntimeError(f"ingest answered {r.status}")
    return time.perf_counter() - t0


def feed(url: str, nodes: int, windows: int) -> int:
    """The fleet's windows, 5,000 events a batch; a batch the engine cut (its body timeout ran out while the
    loop was held) is sent again. How many were cut."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    cut = 0

    def send(events: list[dict[str, Any]]) -> None:
        nonlocal conn, cut
        while True:
            try:
                post(conn, events)
                return
            except (OSError, http.client.HTTPException, RuntimeError):
                cut += 1
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=600)

    start = time.time() - WS * windows
    t0 = time.perf_counter()
    batch: list[dict[str, Any]] = []
    for w in range(windows):
        for n in range(nodes):
            batch.append(
                {
                    "id": uuid.uuid4().hex,
                    "node": f"node-{n:06d}",
                    "source": "nvml",
                    "kind": "gpu_summary",
                    "time": start + WS * w,
                    "attrs": summary_attrs(n),
                }
            )
            if len(batch) == 5_000:
                send(batch)
                batch = []
    if batch:
        send(batch)
    conn.close()
    print(
        f"fed {nodes * windows:,} summaries in {time.perf_counter() - t0:.1f} s ({cut} batches cut)",
        flush=True,
    )
    return cut


def measure_engine(url: str, duration: float) -> dict[str, str]:
    probe = Probe()
    stop = threading.Event()
    threads = start_pollers(url, probe, stop, 2.0)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    ingest: list[float] = []
    t0 = time.perf_counter()
    i = 0
    cut = 0
    while time.perf_counter() - t0 < duration:
        events = [
            {
                "id": uuid.uuid4().hex,
                "node": f"probe-{k % 10}",
                "source": "nvml",
                "kind": "gpu_summary",
                "time": time.time(),
                "attrs": {"gpu": k % 8, "util_mean": 90.0, "window_s": WS},
            }
            for k in range(200)
        ]
        try:
            ingest.append(post(conn, events))
        except (OSError, http.client.HTTPException, RuntimeError):
            cut += 1
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=600)
        i += 1
        time.sleep(max(0.0, t0 + i - time.perf_counter()))
    stop.set()
    for t in threads:
        t.join()
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    metrics = conn.getresponse().read().decode()
    conn.close()
    cycle = {
        line.split()[0]: line.split()[1]
        for line in metrics.splitlines()
        if line.startswith(("watchd_detector_cycle_seconds_sum", "watchd_detector_cycle_seconds_count"))
        or line.startswith("watchd_detector_cycle_longest_slice_seconds ")
    }
    h = sorted(probe.healthz_s)
    r = probe.reliability_s or [float("nan")]
    count = float(cycle.get("watchd_detector_cycle_seconds_count", "nan"))
    busy = float(cycle.get("watchd_detector_cycle_seconds_sum", "nan"))
    return {
        "measured s": f"{duration:.0f}",
        "/healthz requests": f"{len(h)}",
        "/healthz max s": f"{h[-1]:.3f}",
        "/healthz p99 s": f"{h[int(0.99 * (len(h) - 1))]:.3f}",
        "/healthz median s": f"{statistics.median(h):.4f}",
        "reliability GET median / max s": f"{statistics.median(r):.3f} / {max(r):.3f} ({len(r)})",
        "ingest 200 events median / max s": f"{statistics.median(ingest):.3f} / {max(ingest):.3f}",
        "detector cycles": f"{count:.0f}",
        "detector cycle s (mean, computing)": f"{busy / count:.2f}",
        "longest slice of the last cycle s": cycle.get("watchd_detector_cycle_longest_slice_seconds", "-"),
        "errors (healthz, reliability) / ingest cut": f"{probe.errors} / {cut}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--cycles", type=int, default=3, help="detector cycles per form (in process)")
    parser.add_argument("--engine", action="store_true", help="also measure a real engine process")
    parser.add_argument("--engine-only", action="store_true", help="only the real engine")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds (--engine)")
    args = parser.parse_args()
    if not args.engine_only:
        in_process(args)
    if args.engine or args.engine_only:
        engine(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
