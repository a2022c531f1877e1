"""Evaluation suite for the correlation detectors: simulated jobs with and without faults, at several sizes.

Each run simulates one job (``watchd.sim.jobs``: per-GPU 5 s window summaries as the agents ship them, the
agents' ``nccl_spin`` GPU condition, hardware events, InfiniBand port conditions where the scenario says,
and forwarded heartbeats when ``hb``) and feeds it to the engine's detectors exactly as the engine does:
events arrive at their observation time plus the agent's delay (a window is shipped when the next sample
closes it, ~1 s after its end; conditions and heartbeats at once), the detectors run every
``detectors.interval_s`` (5 s) at a phase of their own (the engine's schedule is not the agents'), and in
between every ``detectors.watch_interval_s`` (1 s) for the jobs whose GPUs spin. Findings go through the
default rule pack, so "drains" are the drains the shipped rules would decide.

Printed per scenario and evidence (NVML alone, NVML + heartbeats), over all runs:

* recall: runs where a finding of the expected kind came after the onset;
* precision: of the findings (episodes: first reports, not their revisions), those of the expected kind
  after the onset; any finding on a healthy phase is false;
* culprit accuracy: where the evidence can name the culprit, every finding that names a node names it and
  one does (a first finding corrected later is wrong; "no culprit yet" revised with the right one is right);
  where it cannot ("none"), no finding names a node;
* detect / named p50 / p95: from the fault's onset to the first finding, to the first naming the culprit;
* wrong drains: any drain of a node that is not the hardware culprit.

Then the training-log comparison (scenarios "+ training logs", with NET/IB errors, a CUDA error, the watchdog
timeouts 600 s after the hang and Flight Recorder dumps, against the same seeds without them) and the
detectors' cost per cycle with 1,000 nodes in 100 jobs.

Run: ``.venv/bin/python benchmarks/detection.py`` (``--quick`` for fewer seeds and sizes).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import table  # noqa: E402
from watchd.detect.correlator import Correlator  # noqa: E402
from watchd.detect.finding import Finding  # noqa: E402
from watchd.jobs.model import JobInfo  # noqa: E402
from watchd.model.events import Event  # noqa: E402
from watchd.rules import RuleEngine, load_rules  # noqa: E402
from watchd.sim.jobs import JobRun, simulate  # noqa: E402
from watchd.sim.trainlog import training_events  # noqa: E402

INTERVAL_S = 5.0  # detectors.interval_s: the full cycle
WATCH_INTERVAL_S = 1.0  # detectors.watch_interval_s: the jobs with spinning GPUs, judged between cycles
WINDOW_DELAY_S = 1.0  # a window is shipped when the next sample (1 s later) closes it
EVENT_DELAY_S = 0.1  # heartbeats, health and port conditions: shipped as they happen


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str
    expect: str | None  # the finding kind expected, None: none (a healthy phase)
    culprit: bool  # the evidence can name the culprit node (False: a right finding names none)
    drain_ok: bool  # draining the culprit is right
    duration_s: float = 420.0
    fault_at: float = 200.0
    fault_for_s: float | None = None
    trainlog: bool = False  # the job's own lines arrive too
    ib: bool = False  # the agents' InfiniBand port conditions (watchd.ib) arrive too


SCENARIOS = [
    Scenario("hang, one rank stuck in compute", "hang_compute", "nccl_hang", True, False),
    Scenario("hang, a GPU lost", "hang_lost", "nccl_hang", True, True),
    Scenario("hang, NVLink down", "hang_nvlink", "nccl_hang", True, True),
    Scenario("hang, NIC port down + IB port events", "hang_nic", "nccl_hang", True, True, ib=True),
    Scenario("host-side stall", "host_stall", "host_stall", False, False, fault_for_s=180.0),
    Scenario("thermal straggler", "thermal", "straggler", True, True, duration_s=680.0, fault_at=150.0),
    Scenario(
        "power-brake straggler", "power_brake", "straggler", True, True, duration_s=680.0, fault_at=150.0
    ),
    Scenario(
        "node-wide power brake", "node_power_brake", "straggler", True, True, duration_s=680.0, fault_at=150.0
    ),
    # healthy phases: any finding is a false positive
    Scenario("healthy, long run", "none", None, False, False, duration_s=3600.0),
    Scenario("data-loader stalls (5-25 s)", "data_loading", None, False, False, duration_s=600.0),
    Scenario("memory-bound copies (60 s)", "memcopy", None, False, False, fault_for_s=60.0),
    Scenario("checkpoint write (90 s)", "checkpoint", None, False, False, fault_for_s=90.0),
    Scenario("evaluation pause (60 s)", "eval", None, False, False, fault_for_s=60.0),
    Scenario("pipeline-stage imbalance", "pipeline", None, False, False, duration_s=680.0, fault_at=60.0),
    Scenario("job start and stop", "transients", None, False, False, duration_s=600.0),
    # the training stack's lines; 900 s runs so the watchdog (600 s) fires inside them
    Scenario("hang, NIC fails (every rank spins)", "hang_nic", "nccl_hang", False, False, duration_s=900.0),
    Scenario(
        "hang, NIC fails + training logs",
        "hang_nic",
        "nccl_hang",
        True,
        True,
        duration_s=900.0,
        trainlog=True,
    ),
    Scenario("hang, compute, 900 s", "hang_compute", "nccl_hang", True, False, duration_s=900.0),
    Scenario(
        "hang, compute + training logs",
        "hang_compute",
        "nccl_hang",
        True,
        False,
        duration_s=900.0,
        trainlog=True,
    ),
    Scenario("hang, GPU lost, 900 s", "hang_lost", "nccl_hang", True, True, duration_s=900.0),
    Scenario(
        "hang, GPU lost + training logs",
        "hang_lost",
        "nccl_hang",
        True,
        True,
        duration_s=900.0,
        trainlog=True,
    ),
]
TRAINLOG_KINDS = frozenset({"nic_errors", "cuda_error", "wavefront", "late_arrival"})


@dataclass
class Outcome:
    scenario: Scenario
    nodes: int
    heartbeats: bool
    culprit_node: str = ""
    latency_s: float | None = None  # the first finding of the expected kind, from the fault's onset
    named_s: float | None = None  # the first finding naming the right culprit, from the onset
    culprit_right: bool | None = None  # see _culprit_right
    true_findings: int = 0  # episodes (first reports) of the expected kind after the onset
    false_findings: int = 0  # any other episode
    wrong_drains: int = 0
    right_drains: int = 0
    job_hours: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    seed: int = 0

    def final(self) -> Finding | None:
        """The last finding of the expected kind (a later revision may name another culprit)."""
        mine = [f for f in self.findings if f.kind == self.scenario.expect]
        return mine[-1] if mine else None


def run_one(s: Scenario, nodes: int, heartbeats: bool, seed: int, rules: RuleEngine) -> Outcome:
    job = JobRun(
        s.fault,  # type: ignore[arg-type]
        nodes=nodes,
        duration_s=s.duration_s,
        fault_at=s.fault_at + (seed * 1.7) % 5.0,  # faults start anywhere inside a window
        fault_for_s=s.fault_for_s,
        culprit=(seed % nodes, seed % 8),
        heartbeats=heartbeats,
        seed=seed,
        ib_events=s.ib,
    )
    correlator = Correlator()
    correlator.topology.replace("slurm", [JobInfo(job.job, job.nodes_list, "slurm", partition="gpu")])
    out = Outcome(s, nodes, heartbeats, job.culprit_node, job_hours=s.duration_s / 3600.0, seed=seed)
    # The engine's cycle runs on its own schedule, not in step with the agents' windows: a phase per run.
    phase = random.Random(seed * 7 + nodes).uniform(0.0, INTERVAL_S)
    tick = job.start + phase
    next_cycle = tick + INTERVAL_S
    watch = correlator.run_watched if correlator.config.watch_interval_s else None
    step = WATCH_INTERVAL_S if watch is not None else INTERVAL_S
    lines = list(training_events(job)) if s.trainlog else []
    events = sorted([*simulate(job), *lines], key=_arrival)
    # In the start-and-stop run the scheduler stops listing the job once its processes ended.
    end_at = job.start + s.duration_s - 45.0 if s.fault == "transients" else float("inf")

    def advance(until: float) -> None:
        nonlocal tick, next_cycle
        while tick + step <= until:
            tick += step
            if tick >= end_at:
                correlator.topology.replace("slurm", [])
            if tick >= next_cycle - 1e-6:
                next_cycle += INTERVAL_S
                _judge(correlator.run(tick), job, s, out, rules)
            elif watch is not None:
                _judge(watch(tick), job, s, out, rules)

    for e in events:
        advance(_arrival(e))
        correlator.observe(e)
    advance(job.start + s.duration_s + INTERVAL_S)
    out.culprit_right = _culprit_right(out, job, s)
    return out


def _arrival(e: Event) -> float:
    if e.source == "slurm-jobs":  # training-log events carry the time the agent read them
        return e.time
    return e.time + (WINDOW_DELAY_S if e.kind == "gpu_summary" else EVENT_DELAY_S)


def _judge(findings: list[Finding], job: JobRun, s: Scenario, out: Outcome, rules: RuleEngine) -> None:
    onset = job.start + job.fault_at
    for f in findings:
        out.findings.append(f)
        expected = s.expect is not None and f.kind == s.expect and f.time >= onset
        if expected and out.latency_s is None:
            out.latency_s = f.time - onset
        if expected and out.named_s is None and f.culprit_node == job.culprit_node and s.culprit:
            out.named_s = f.time - onset
        if f.revision == 0:
            if expected:
                out.true_findings += 1
            else:
                out.false_findings += 1
        for decision in rules.evaluate(f.to_event()):
            for action in decision.actions:
                if action.kind != "drain":
                    continue
                if s.drain_ok and action.node == job.culprit_node:
                    out.right_drains += 1
                else:
                    out.wrong_drains += 1


def _culprit_right(out: Outcome, job: JobRun, s: Scenario) -> bool | None:
    """Where the evidence can name the culprit: every finding of the expected kind that names a node names
    the culprit (a first finding later corrected is wrong; one that says "no culprit yet" and is revised
    with the culprit is right), and one does. Where it cannot: no finding names a node."""
    if s.expect is None:
        return None
    mine = [f for f in out.findings if f.kind == s.expect and f.time >= job.start + job.fault_at]
    named = {f.culprit_node for f in mine if f.culprit_node is not None}
    if not mine:
        return False
    if not s.culprit:
        return not named
    return named == {job.culprit_node}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} s"


def evaluate(
    sizes: list[int],
    seeds: int,
    big_seeds: int,
    only: list[Scenario] | None = None,
    progress: bool = False,
) -> list[Outcome]:
    rule_set = load_rules([])  # the embedded default pack, with the findings rules
    outcomes: list[Outcome] = []
    for s in only or SCENARIOS:
        for nodes in sizes:
            n_seeds = seeds if nodes <= 32 else big_seeds
            for hb in (False, True):
                for seed in range(1, n_seeds + 1):
                    sc = s
                    if s.fault == "none" and nodes > 32:
                        sc = replace(s, duration_s=900.0)  # keep the big healthy runs affordable
                    t = time.perf_counter()
                    o = run_one(sc, nodes, hb, seed, rule_set.engine())
                    outcomes.append(o)
                    if progress:
                        print(
                            f"{s.name}, {nodes} nodes, {'nvml+hb' if hb else 'nvml'}, seed {seed}: "
                            f"{time.perf_counter() - t:.0f} s; detect {fmt(o.latency_s)}, named "
                            f"{fmt(o.named_s)}, culprit {o.culprit_right}, false {o.false_findings}, "
                            f"wrong drains {o.wrong_drains}",
                            file=sys.stderr,
                            flush=True,
                        )
    return outcomes


def _ratio(n: int, d: int) -> str:
    return f"{n / d:.0%} ({n}/{d})" if d else "-"


def report(outcomes: list[Outcome]) -> None:
    """Per scenario and evidence: detection recall, finding precision (any finding on a healthy phase, or of
    another kind, is false), culprit accuracy (a corrected first finding counts as wrong), time to detect
    and to name the culprit (p50/p95, from the fault's onset), wrong drains."""
    rows = []
    for s in SCENARIOS:
        for hb in (False, True):
            mine = [o for o in outcomes if o.scenario.name == s.name and o.heartbeats == hb]
            if not mine:
                continue
            lat = [o.latency_s for o in mine if o.latency_s is not None]
            named = [o.named_s for o in mine if o.named_s is not None]
            true = sum(o.true_findings for o in mine)
            false = sum(o.false_findings for o in mine)
            culprits = [o.culprit_right for o in mine if o.culprit_right is not None]
            rows.append(
                [
                    s.name,
                    "nvml+hb" if hb else "nvml",
                    str(len(mine)),
                    _ratio(len(lat), len(mine)) if s.expect else "-",
                    _ratio(true, true + false) if true + false else "-",
                    str(false),
                    (_ratio(sum(culprits), len(culprits)) + ("" if s.culprit else " none"))
                    if culprits
                    else "-",
                    f"{fmt(statistics.median(lat))} / {fmt(pct(lat, 0.95))}" if lat else "-",
                    f"{fmt(statistics.median(named))} / {fmt(pct(named, 0.95))}" if named else "-",
                    str(sum(o.wrong_drains for o in mine)),
                    str(sum(o.right_drains for o in mine)) if s.drain_ok else "-",
                ]
            )
    print(
        table(
            [
                "scenario",
                "evidence",
                "runs",
                "recall",
                "precision",
                "false findings",
                "culprit accuracy",
                "detect p50 / p95",
                "named p50 / p95",
                "wrong drains",
                "culprit drains",
            ],
            rows,
        )
    )
    print()
    for hb in (False, True):
        mode = [o for o in outcomes if o.heartbeats == hb]
        hang = [o.latency_s for o in mode if o.scenario.expect == "nccl_hang" and o.latency_s is not None]
        straggler = [
            o.latency_s for o in mode if o.scenario.expect == "straggler" and o.latency_s is not None
        ]
        healthy = [o for o in mode if o.scenario.expect is None]
        hours = sum(o.job_hours for o in healthy)
        worst = min(
            (
                (sum(bool(o.culprit_right) for o in runs) / len(runs), name)
                for name in {o.scenario.name for o in mode if o.scenario.expect is not None}
                if (runs := [o for o in mode if o.scenario.name == name])
            ),
            default=(float("nan"), "-"),
        )
        missed = sum(1 for o in mode if o.scenario.expect and o.latency_s is None)
        false = sum(o.false_findings for o in mode)
        if not hang:
            continue
        print(
            f"overall, {'nvml+heartbeats' if hb else 'nvml alone'}: "
            f"hang detect p50 {fmt(statistics.median(hang))} "
            f"p95 {fmt(pct(hang, 0.95))} (goal {'8' if hb else '15'} s); "
            f"straggler p95 {fmt(pct(straggler, 0.95)) if straggler else '-'} (goal 60 s); "
            f"lowest culprit accuracy {worst[0]:.1%} ({worst[1] if worst[0] < 1 else 'every scenario'}; "
            f"goal 95%); missed {missed}; "
            f"false findings {false} ({false / max(hours, 1e-9):.3f} per healthy job-hour, "
            f"{hours:.1f} job-h); "
            f"wrong drains {sum(o.wrong_drains for o in mode)}"
        )


def trainlog_effect(outcomes: list[Outcome]) -> None:
    """Per scenario with training logs, against the same seeds without them."""
    rows = []
    for s in SCENARIOS:
        if not s.trainlog:
            continue
        twin = next(
            t for t in SCENARIOS if t.fault == s.fault and not t.trainlog and t.duration_s == s.duration_s
        )
        base = {(o.nodes, o.heartbeats, o.seed): o for o in outcomes if o.scenario is twin}
        for hb in (False, True):
            runs = [o for o in outcomes if o.scenario is s and o.heartbeats == hb]
            changed_right = changed_wrong = confirmed = none = 0
            by: dict[str, int] = {}
            for o in runs:
                b = base.get((o.nodes, o.heartbeats, o.seed))
                f, g = o.final(), b.final() if b else None
                node, before = (f.culprit_node if f else None), (g.culprit_node if g else None)
                if f is not None and node != before:
                    right = node is not None and node == o.culprit_node
                    changed_right += right
                    changed_wrong += not right
                    by[f.evidence] = by.get(f.evidence, 0) + 1
                elif (
                    f is not None
                    and node is not None
                    and (
                        f.evidence in TRAINLOG_KINDS
                        or TRAINLOG_KINDS & set(str(f.extra.get("corroborated", "")).split(","))
                    )
                ):
                    confirmed += 1
                    by[f.evidence] = by.get(f.evidence, 0) + 1
                else:
                    none += 1
            rows.append(
                [
                    s.name,
                    "yes" if hb else "no",
                    str(len(runs)),
                    str(changed_right),
                    str(changed_wrong),
                    str(confirmed),
                    str(none),
                    ", ".join(f"{k} {v}" for k, v in sorted(by.items())) or "-",
                ]
            )
    print()
    print(
        table(
            [
                "with training logs",
                "heartbeats",
                "runs",
                "changed: right",
                "changed: wrong",
                "confirmed",
                "no effect",
                "final evidence",
            ],
            rows,
        )
    )


def cycle_cost(jobs: int = 100, nodes_per_job: int = 10, gpus: int = 8, minutes: int = 5) -> None:
    """Detector cost with 1,000 nodes in 100 jobs: per observed window and per cycle (one pass), and the
    state it holds (a second pass under tracemalloc, started after the events were generated)."""
    runs = [
        JobRun(
            "none",
            nodes=nodes_per_job,
            gpus_per_node=gpus,
            duration_s=minutes * 60.0,
            seed=j,
            job=f"slurm:{1000 + j}",
            node_prefix=f"n{j:03d}",
        )
        for j in range(jobs)
    ]
    listing = [JobInfo(r.job, r.nodes_list, "slurm", partition="gpu") for r in runs]
    events = sorted((e for r in runs for e in simulate(r)), key=lambda e: e.time)

    def feed(correlator: Correlator) -> tuple[float, list[float]]:
        correlator.topology.replace("slurm", listing)
        observe_s = 0.0
        cycles: list[float] = []
        next_cycle = runs[0].start + INTERVAL_S
        i = 0
        while i < len(events):
            t = time.perf_counter()
            while i < len(events) and events[i].time <= next_cycle:
                correlator.observe(events[i])
                i += 1
            observe_s += time.perf_counter() - t
            t = time.perf_counter()
            correlator.run(next_cycle)
            cycles.append(time.perf_counter() - t)
            next_cycle += INTERVAL_S
        return observe_s, cycles

    observe_s, cycles = feed(Correlator())
    tracemalloc.start()
    kept = Correlator()
    feed(kept)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    steady = cycles[len(cycles) // 3 :]
    per_cycle = statistics.median(steady)
    print(
        f"\ndetector cost, {jobs * nodes_per_job} nodes x {gpus} GPUs in {jobs} jobs: "
        f"observe {observe_s / len(events) * 1e6:.1f} us per window ({len(events)} windows), "
        f"cycle p50 {per_cycle * 1e3:.0f} ms, max {max(steady) * 1e3:.0f} ms "
        f"(every {INTERVAL_S:.0f} s: {per_cycle / INTERVAL_S:.1%} of one core, plus "
        f"{observe_s / len(events) * len(kept.fleet.gpus) / INTERVAL_S:.1%} to observe); "
        f"state {held / 2**20:.1f} MiB for {len(kept.fleet.gpus)} GPUs "
        f"({held / max(1, len(kept.fleet.gpus)) / 1024:.1f} KiB each, {minutes} min of windows)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sizes 2 and 8, 2 seeds")
    ap.add_argument("--sizes", default="2,8,32,128,512")
    ap.add_argument("--seeds", type=int, default=5, help="runs per scenario, size and heartbeat setting")
    ap.add_argument("--big-seeds", type=int, default=1, help="runs for sizes above 32 nodes")
    ap.add_argument("--trainlog", action="store_true", help="only the training-log scenarios (900 s hangs)")
    ap.add_argument("--scenarios", default="", help="only the scenarios whose name contains one of these (,)")
    ap.add_argument("--progress", action="store_true", help="each run's wall time and outcome on stderr")
    args = ap.parse_args()
    sizes = [2, 8] if args.quick else [int(x) for x in args.sizes.split(",")]
    seeds = 2 if args.quick else args.seeds
    started = time.perf_counter()
    only = [s for s in SCENARIOS if s.duration_s == 900.0] if args.trainlog else None
    if args.scenarios:
        wanted = [w.strip() for w in args.scenarios.split(",") if w.strip()]
        only = [s for s in only or SCENARIOS if any(w in s.name for w in wanted)]
    outcomes = evaluate(sizes, seeds, args.big_seeds, only, args.progress)
    print(
        f"{len(outcomes)} runs, job sizes {sizes} nodes x 8 GPUs, in {time.perf_counter() - started:.0f} s\n"
    )
    report(outcomes)
    trainlog_effect(outcomes)
    cycle_cost()


if __name__ == "__main__":
    main()
