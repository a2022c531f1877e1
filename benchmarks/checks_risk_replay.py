"""Checks scheduled by risk against fixed cron: one synthetic fleet history replayed through both planners.

The history (seeded; the same exogenous inputs for both planners): 1,000 nodes of 8 GPUs under leaf switches
of 32, 90 days, one round a day. Every assumption, and where it comes from:

- **Fault onsets**: hardware faults at 2.7 per 1,000 node-days on average. Llama 3 (Grattafiori et al., "The
  Llama 3 Herd of Models", 2024, table 5; the table as reproduced at glennklockwood.com/garden/component-
  reliability): 419 unexpected interruptions in 54 days on 16,384 H100 GPUs (2,048 nodes) = 3.8 per 1,000
  node-days, of which the hardware rows are 72% (faulty GPU 30.1%, HBM3 17.2%, SRAM 4.5%, GSP 4.1%, network
  switch/cable 8.4%, NIC 1.7%, thermal/SDC 2.8%, host hardware 3.4%). Cross-check: Kokolis et al.,
  "Revisiting Reliability in Large-Scale Machine Learning Research Clusters" (HPCA 2025; via Crusoe's
  summary: a 16,384-GPU job's MTTF 1.8 h on RSC-1) gives about 6.5 per 1,000 node-days for all causes.
- **Lemons**: 4.8% of nodes fail 20 times as often as the rest. Lablup's report on a 63-node B200 cluster
  (arXiv 2605.09370): the top 3 of 63 nodes took more than half of all exclusions. Sensitivity row: 1.2% of
  the fleet (the share Kokolis et al.'s lemon-node analysis flagged, as cited by a secondary summary), same
  ratio.
- **Network faults**: 8.4 + 1.7 = 10.1 of Llama 3's 72 hardware points (14%) are switch, cable or NIC; such a
  fault here takes 1 to 3 further nodes of the same leaf switch with it (a line card, a bundle of cables:
  assumed, no published figure found) and its events are NIC errors.
- **Precursors**: 20% of faults give a hardware (or NIC) event before they hit a job, at a uniform time in
  the latent period: Lablup again, 2 of 10 Xid-identified GPU failures detected before their Xid.
- **False alarms**: every node, healthy or not, raises such events at 0.0133 a node-day (Lablup's
  multi-signal detector: 0.84 false positives a day over 63 nodes).
- **Latent period**: a fault stays latent (a check would find it; no job has hit it) for an exponential time
  of mean 7 days. No published distribution was found: it is an assumption, and rows with 3 and 14 days
  show what it changes. A fault that outlives it hits a job: the reactive path drains the node on its
  hardware evidence (a failure in the reliability record: what the lemon term reads), 2 days of repair.
- **Idle**: a node is idle at the round with probability 0.2 (RSC-1/RSC-2 ran at about 80% utilization,
  Kokolis et al.); only idle nodes are checked. A check finds every latent fault the node carries (the
  check's own sensitivity is not modelled); a found fault takes the node out for 2 days (validation).
- **Cost**: a run is 10 minutes on 8 GPUs, 1.33 GPU-hours; both planners get the same budget, 66.7 GPU-hours a
  day (50 runs, 5% of the fleet). The risk planner's floor, ``max_interval`` 30 days, may spend past it (the
  table shows what each spent).

The planners: **oldest first** (today's rounds: the least recently checked idle nodes, until the budget is
spent) and **risk** (:mod:`watchd.checks.risk` with its shipped weights, which come from the same published
figures and were not fitted to this replay: watchd/checks/risk_params.py says how each was derived).

Reported per scenario: latent faults, found by a check before they hit a job (and the share), mean time from
onset to detection, GPU-hours spent, faults found per 1,000 GPU-hours, and the risk planner's ratio to
oldest-first. Then the planner's CPU time for one round at 1,000 and 10,000 nodes (scoring, ordering,
admitting every node), against a floor measured in the same run: today's order (sorting the nodes by their
last run, one lookup each).

Each scenario is replayed on 5 histories (seeds 7 to 11), summed: one history's ratio moves by +-10%.

Run: ``.venv/bin/python benchmarks/checks_risk_replay.py [--quick] [--seeds N]`` (``--quick``: 300 nodes, 60
days, 2 histories).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import table  # noqa: E402
from watchd.checks.risk import DAY, NodeEvidence, Order, order, score  # noqa: E402
from watchd.checks.risk_params import RiskWeights  # noqa: E402

GPUS = 8
RUN_GPU_H = 10 / 60 * GPUS  # 10 minutes on 8 GPUs
SWITCH = 32
HW_RATE = 0.0027  # faults per node-day (Llama 3's hardware share)
NET_SHARE = 10.1 / 72  # network switch/cable + NIC, of the hardware rows
PRECURSOR = 0.2
FALSE_ALARMS = 0.84 / 63  # per node-day
IDLE = 0.2
REPAIR_S = 2 * DAY
MAX_INTERVAL = 30 * DAY


@dataclass
class Scenario:
    name: str
    latent_days: float = 7.0
    lemon_share: float = 0.048
    lemon_ratio: float = 20.0
    precursor: float = PRECURSOR


@dataclass
class Fault:
    node: int
    onset: float
    manifest: float
    net: bool
    found: float | None = None
    hit: float | None = None


@dataclass
class History:
    """The exogenous inputs, the same for every planner."""

    nodes: int
    days: int
    faults: list[Fault]
    events: list[tuple[float, int, str]]  # (time, node, hardware | nic), sorted
    idle: list[list[bool]]  # day -> node -> idle at the round
    first_pass: list[float]


def make_history(sc: Scenario, nodes: int, days: int, seed: int) -> History:
    rng = random.Random(seed)
    horizon = days * DAY
    lemons = set(rng.sample(range(nodes), max(1, round(sc.lemon_share * nodes))))
    normal = HW_RATE / ((1 - sc.lemon_share) + sc.lemon_share * sc.lemon_ratio)
    faults: list[Fault] = []
    events: list[tuple[float, int, str]] = []
    for n in range(nodes):
        rate = normal * (sc.lemon_ratio if n in lemons else 1.0) / DAY
        t = rng.expovariate(rate)
        while t < horizon:
            net = rng.random() < NET_SHARE
            hit = [n]
            if net:  # the same leaf switch: 1 to 3 more of its nodes
                base = n - n % SWITCH
                others = [m for m in range(base, min(nodes, base + SWITCH)) if m != n]
                hit += rng.sample(others, min(len(others), rng.randint(1, 3)))
            for m in hit:
                latent = rng.expovariate(1.0 / (sc.latent_days * DAY))
                faults.append(Fault(m, t, t + latent, net))
                if rng.random() < sc.precursor:
                    events.append((t + rng.random() * latent, m, "nic" if net else "hardware"))
            t += rng.expovariate(rate)
        t = rng.expovariate(FALSE_ALARMS / DAY)
        while t < horizon:
            events.append((t, n, "nic" if rng.random() < NET_SHARE else "hardware"))
            t += rng.expovariate(FALSE_ALARMS / DAY)
    events.sort()
    idle = [[rng.random() < IDLE for _ in range(nodes)] for _ in range(days)]
    first_pass = [-rng.random() * MAX_INTERVAL for _ in range(nodes)]
    return History(nodes, days, faults, events, idle, first_pass)


@dataclass
class Outcome:
    found: int = 0
    hit: int = 0
    detect_days: list[float] = field(default_factory=list)
    runs: int = 0
    cpu_s: float = 0.0

    @property
    def gpu_hours(self) -> float:
        return self.runs * RUN_GPU_H


def replay(h: History, planner: str, budget_gpu_h: float) -> Outcome:
    w = RiskWeights()
    faults = sorted((Fault(f.node, f.onset, f.manifest, f.net) for f in h.faults), key=lambda f: f.manifest)
    by_node: dict[int, list[Fault]] = {}
    for f in faults:
        by_node.setdefault(f.node, []).append(f)
    last_pass = list(h.first_pass)
    last_run = list(h.first_pass)
    failed_at: list[float | None] = [None] * h.nodes
    out_until = [-math.inf] * h.nodes
    failures: list[list[float]] = [[] for _ in range(h.nodes)]
    repaired: list[float | None] = [None] * h.nodes
    seen: dict[str, list[list[float]]] = {
        "hardware": [[] for _ in range(h.nodes)],
        "nic": [[] for _ in range(h.nodes)],
    }
    out = Outcome()
    ev_i = hit_i = 0
    for day in range(h.days):
        now = day * DAY
        while ev_i < len(h.events) and h.events[ev_i][0] <= now:
            t, n, cls = h.events[ev_i]
            seen[cls][n].append(t)
            ev_i += 1
        while hit_i < len(faults) and faults[hit_i].manifest <= now:
            f = faults[hit_i]
            hit_i += 1
            if f.found is None and f.hit is None:
                f.hit = f.manifest
                out.hit += 1
                failures[f.node].append(f.manifest)  # drained on its hardware evidence: a failure
                out_until[f.node] = max(out_until[f.node], f.manifest + REPAIR_S)
                repaired[f.node] = f.manifest + REPAIR_S
        idle = [n for n in range(h.nodes) if h.idle[day][n] and out_until[n] <= now]
        c0 = time.process_time()
        if planner == "oldest_first":
            chosen = sorted(idle, key=lambda n: (last_run[n], n))[: int(budget_gpu_h / RUN_GPU_H + 1e-9)]
        else:
            names = {n: f"n{n:05d}" for n in idle}
            switch_failed: dict[int, list[int]] = {}
            for n in range(h.nodes):
                fa = failed_at[n]
                if fa is not None and fa >= now - w.event_window:
                    switch_failed.setdefault(n // SWITCH, []).append(n)
            risks = []
            for n in idle:
                ev = NodeEvidence(
                    last_pass=last_pass[n],
                    hardware=seen["hardware"][n],
                    nic=seen["nic"][n],
                    failures=failures[n],
                    repaired_at=repaired[n],
                    peers_failed=[
                        names.get(m, f"n{m:05d}") for m in switch_failed.get(n // SWITCH, ()) if m != n
                    ],
                )
                risks.append(score(names[n], ev, now, w, MAX_INTERVAL))
            plan = Order(order(risks), dict.fromkeys(names.values(), RUN_GPU_H), {"gpu": budget_gpu_h})
            chosen = [int(r.node[1:]) for r in plan.ranked if plan.admit(r.node, ("gpu",)) is None]
        out.cpu_s += time.process_time() - c0
        for n in chosen:
            out.runs += 1
            last_run[n] = now
            latent = [
                f
                for f in by_node.get(n, ())
                if f.onset <= now < f.manifest and f.found is None and f.hit is None
            ]
            if latent:
                for f in latent:
                    f.found = now
                    out.found += 1
                    out.detect_days.append((now - f.onset) / DAY)
                failed_at[n] = now
                out_until[n] = now + REPAIR_S
            else:
                last_pass[n] = now
    return out


def planner_cost(nodes: int, seed: int, repeat: int) -> tuple[float, float]:
    """One round's planning at ``nodes`` nodes (all idle): risk (score, order, admit) and the floor (today's
    order: sort by last run, one lookup each)."""
    rng = random.Random(seed)
    w = RiskWeights()
    now = 100 * DAY
    names = [f"n{i:05d}" for i in range(nodes)]
    evidence = {
        n: NodeEvidence(
            last_pass=now - rng.random() * MAX_INTERVAL,
            hardware=[now - rng.random() * 20 * DAY] if rng.random() < 0.1 else [],
            nic=[now - rng.random() * 20 * DAY] if rng.random() < 0.05 else [],
            failures=[now - rng.random() * 28 * DAY] if rng.random() < 0.05 else [],
            repaired_at=now - rng.random() * 10 * DAY if rng.random() < 0.02 else None,
            peers_failed=["n00001"] if rng.random() < 0.03 else [],
        )
        for n in names
    }
    last = {n: ev.last_pass for n, ev in evidence.items()}
    idle = dict.fromkeys(names, True)
    risk_t, floor_t = [], []
    for _ in range(repeat):
        c0 = time.process_time()
        plan = Order(
            order(score(n, evidence[n], now, w, MAX_INTERVAL) for n in names),
            dict.fromkeys(names, RUN_GPU_H),
            {"gpu": nodes * 0.05 * RUN_GPU_H},
        )
        admitted = [r.node for r in plan.ranked if plan.admit(r.node, ("gpu",)) is None]
        risk_t.append(time.process_time() - c0)
        c0 = time.process_time()
        ranked = sorted(names, key=lambda n: (last[n], n))
        _ = [idle[n] for n in ranked]
        floor_t.append(time.process_time() - c0)
        assert admitted
    return statistics.median(risk_t), statistics.median(floor_t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="300 nodes, 60 days")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--seeds", type=int, default=5, help="histories per scenario (seed, seed+1, ...), summed")
    args = ap.parse_args()
    nodes, days = (300, 60) if args.quick else (1000, 90)
    if args.quick:
        args.seeds = min(args.seeds, 2)
    budget = nodes * 0.05 * RUN_GPU_H
    scenarios = [
        Scenario("base: latent 7 d"),
        Scenario("latent 3 d", latent_days=3.0),
        Scenario("latent 14 d", latent_days=14.0),
        Scenario("lemons 1.2%", lemon_share=0.012),
        Scenario("no precursors", precursor=0.0),
    ]
    print(f"measured on {sys.platform}, {time.strftime('%Y-%m-%d')}, python {sys.version.split()[0]}")
    print(
        f"{nodes} nodes x {GPUS} GPUs, {days} days, one round a day, budget {budget:.1f} GPU-hours a day "
        f"({budget / RUN_GPU_H:.0f} runs of {RUN_GPU_H:.2f} GPU-hours); {args.seeds} histories per scenario "
        f"(seeds {args.seed}..{args.seed + args.seeds - 1}), summed"
    )
    rows = []
    t0 = time.perf_counter()
    for sc in scenarios:
        res = {p: Outcome() for p in ("oldest_first", "risk")}
        total = 0
        for seed in range(args.seed, args.seed + args.seeds):
            h = make_history(sc, nodes, days, seed)
            total += len(h.faults)
            for p, acc in res.items():
                o = replay(h, p, budget)
                acc.found += o.found
                acc.hit += o.hit
                acc.runs += o.runs
                acc.detect_days += o.detect_days
        for p, o in res.items():
            mttd = statistics.mean(o.detect_days) if o.detect_days else float("nan")
            per_k = o.found / o.gpu_hours * 1000 if o.gpu_hours else 0.0
            ratio = ""
            if p == "risk":
                base = res["oldest_first"]
                base_k = base.found / base.gpu_hours * 1000 if base.gpu_hours else 0.0
                ratio = f"{o.found / max(1, base.found):.2f}x found, {per_k / base_k:.2f}x per GPU-h"
            rows.append(
                [
                    sc.name if p == "oldest_first" else "",
                    p,
                    str(total),
                    f"{o.found} ({o.found / total:.0%})",
                    str(o.hit),
                    f"{mttd:.1f}",
                    f"{o.gpu_hours:,.0f}",
                    f"{per_k:.2f}",
                    ratio,
                ]
            )
    print(
        table(
            [
                "scenario",
                "planner",
                "latent faults",
                "found by a check",
                "hit a job",
                "MTTD days",
                "GPU-hours",
                "found/1k GPU-h",
                "risk vs oldest",
            ],
            rows,
        )
    )
    print(f"replay wall time {time.perf_counter() - t0:.1f} s (both planners, every scenario)")
    cost_rows = []
    for n, rep in ((1000, 20), (10000, 5)):
        risk_s, floor_s = planner_cost(n, args.seed, rep)
        cost_rows.append(
            [f"{n:,}", f"{risk_s * 1e3:.1f}", f"{floor_s * 1e3:.2f}", f"{risk_s / floor_s:.0f}x"]
        )
    print("planner CPU time per round (every node idle, median), floor: today's oldest-first sort")
    print(table(["nodes", "risk plan ms", "floor ms", "ratio"], cost_rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
