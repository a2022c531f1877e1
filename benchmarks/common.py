"""Shared by the throughput benchmarks: a realistic, reproducible event stream and synthetic rule files.

Events look like what the agent ships: Xid events with the attributes the agent's parser and catalog attach
(parsed once per Xid code with the real parser, then varied per event), plus ``gpu_health`` telemetry
events, over ``gpus`` GPUs (8 per node) with job ids, in observation-time order.
"""

from __future__ import annotations

import random
import resource
import time
from collections.abc import Callable, Sequence
from typing import Any

from watchd.model.events import Event, Scalar
from watchd.xid import XidParser
from watchd.xid.catalog import known_xids
from watchd.xid.render import record_to_json

BUS_IDS = (
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
)
T0 = 1_760_000_000.0

# Xid codes as they show up in a large fleet: application Xids dominate, hardware ones are rare.
XID_WEIGHTS: dict[int, float] = {
    13: 20,
    31: 25,
    43: 10,
    45: 8,
    63: 6,
    94: 5,
    8: 3,
    32: 2,
    48: 2,
    64: 1,
    74: 2,
    79: 2,
    92: 3,
    95: 1,
    109: 1,
    119: 2,
    120: 1,
    122: 1,
    144: 1,
    154: 1,
}
MESSAGES: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_12340000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000010",
    45: "Ch 00000010",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    144: "NVLink: Fatal error detected on link 4 (0x1, 0x0)",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}
HEALTH_CONDITIONS: dict[str, float] = {
    "pcie_replay_burst": 30,
    "nvlink_errors": 25,
    "thermal_slowdown": 15,
    "hw_slowdown": 10,
    "power_brake": 5,
    "row_remap_pending": 3,
    "ecc_dbe": 1,
    "recovery_action": 1,
}
PROCESSES = ("python3", "pt_main_thread", "python", "torchrun", "nccl-tests")


def _xid_templates() -> dict[int, dict[str, Scalar]]:
    """The attributes the agent attaches to each Xid code, from the real parser and catalog."""
    parser = XidParser()
    out: dict[int, dict[str, Scalar]] = {}
    for xid in XID_WEIGHTS:
        line = (
            f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=4242, name=python3, {MESSAGES.get(xid, 'Ch 0000000a')}"
        )
        records = parser.feed(line)
        assert records, line
        attrs = record_to_json(records[-1])
        out[xid] = {k: v for k, v in attrs.items() if v is None or isinstance(v, str | int | float)}
    return out


def make_events(
    count: int,
    gpus: int = 8000,
    seed: int = 1,
    id_prefix: str = "e",
    start: float = T0,
    every_gpu: bool = False,
) -> list[Event]:
    """``count`` events over ``gpus`` GPUs (8 per node): 80% Xid, 20% gpu_health, time-ordered from
    ``start``; GPUs at random, or each in turn with ``every_gpu``."""
    rng = random.Random(seed)
    templates = _xid_templates()
    xids = list(XID_WEIGHTS)
    xid_w = list(XID_WEIGHTS.values())
    conds = list(HEALTH_CONDITIONS)
    cond_w = list(HEALTH_CONDITIONS.values())
    jobs_per_gpu = 3  # a GPU runs a handful of jobs over the stream's span
    events: list[Event] = []
    now = start
    for i in range(count):
        now += rng.expovariate(100.0)  # ~100 events/s across the fleet
        g = i % gpus if every_gpu else rng.randrange(gpus)
        node = f"gpu-{g // 8:05d}"
        bus = BUS_IDS[g % 8]
        job = str(100_000 + g * jobs_per_gpu + rng.randrange(jobs_per_gpu))
        if rng.random() < 0.8:
            xid = rng.choices(xids, xid_w)[0]
            attrs = dict(templates[xid])
            pid = rng.randrange(1000, 60_000)
            process = rng.choice(PROCESSES)
            attrs.update(pci_bus_id=bus, pid=pid, process=process, job=job, gpu=g % 8)
            attrs["raw"] = f"NVRM: Xid (PCI:{bus[:-2]}): {xid}, pid={pid}, name={process}, {attrs['message']}"
            events.append(Event(f"{id_prefix}{i}", node, "kmsg", "xid", now, attrs))
        else:
            cond = rng.choices(conds, cond_w)[0]
            value: float = rng.choice((0, 0, 1, 2, 5, 17, 120))
            attrs = {
                "condition": cond,
                "gpu": g % 8,
                "pci_bus_id": bus,
                "uuid": f"GPU-{g:08x}-bench",
                "job": job,
                "value": value,
                "threshold": 1,
                "evidence": f"{cond} value {value} over threshold 1",
            }
            events.append(Event(f"{id_prefix}{i}", node, "nvml", "gpu_health", now, attrs))
    return events


# ------------------------------------------------------------------------------------------- rules

_FIELD_REGEXES = (  # each holds for 1-10% of the events the rule's pinned field lets through
    ("message", "faulted @ 0x7f_1234"),
    ("process", "^nccl-"),
    ("node", "^gpu-000[0-4]"),
    ("node", "17$"),
    ("raw", r"pid=5\d{4},"),
)


def synthetic_rules_yaml(count: int, seed: int = 7, prefix: str = "syn") -> str:
    """``count`` rules as one YAML rule file: ~63% kind + one pinned field (with a second, selective
    condition on most), ~25% regex/numeric operators on top of the pinned field, ~2% only ``kind``
    (checked for every event of that kind), ~10% stateful (group_by node/pci_bus_id, count within a
    window, distinct jobs, cooldown, unless)."""
    rng = random.Random(seed)
    codes = sorted(known_xids())
    conds = list(HEALTH_CONDITIONS)
    out = ["rules:"]
    for i in range(count):
        name = f"{prefix}-{i:05d}"
        r = rng.random()
        health = rng.random() < 0.25
        if health:
            pin = f"condition: {{in: [{', '.join(rng.sample(conds, rng.choice((1, 1, 2))))}]}}"
            kind = "gpu_health"
        else:
            pin = f"xid: {{in: [{', '.join(str(c) for c in rng.sample(codes, rng.choice((1, 2, 3))))}]}}"
            kind = "xid"
        extra: list[str] = []
        stateful: list[str] = []
        if r < 0.10:  # stateful
            group = rng.choice(("[node]", "[node, pci_bus_id]", "[node, pci_bus_id, xid]"))
            if health:
                group = rng.choice(("[node]", "[node, pci_bus_id]", "[node, gpu, condition]"))
            style = rng.randrange(4)
            stateful.append(f"    group_by: {group}")
            if style == 0:
                stateful += ["    count: 3", "    window: 1h", "    cooldown: 1h"]
            elif style == 1:
                stateful += ["    count: 3", "    window: 24h", "    distinct: {job: 2}", "    cooldown: 6h"]
            elif style == 2:
                stateful += ["    cooldown: 1h"]
            else:
                stateful += [
                    "    unless:",
                    f"      match: {{kind: {kind}, job: {{exists: false}}}}",
                    "      within: 30s",
                    "    cooldown: 1h",
                ]
        elif r < 0.35:  # operators
            if health:
                extra.append(f"value: {{ge: {rng.choice((50, 100, 120))}}}")
                extra.append(f"node: {{regex: '{rng.randrange(10, 100)}$'}}")
            else:
                field, regex = rng.choice(_FIELD_REGEXES)
                extra.append(f"{field}: {{regex: {regex!r}}}")
                if rng.random() < 0.5:
                    extra.append(f"pid: {{gt: {rng.randrange(1000, 60_000)}}}")
        elif r < 0.37:  # kind only: a candidate for every event of the kind
            pin = ""
            if health:
                extra.append(f"evidence: {{regex: 'over threshold {rng.randrange(100, 999)}'}}")
            else:
                extra.append(f"process: {{regex: '^{rng.choice(PROCESSES)}-{i}$'}}")
        elif rng.random() < 0.9:  # pinned field plus a selective equality (a site's node-specific rule)
            extra.append(f"node: gpu-{rng.randrange(1000):05d}")
        match = ", ".join(x for x in (f"kind: {kind}", pin, *extra) if x)
        action = rng.choice(
            (
                '      - log: {message: "' + name + ' {{ node }} {{ pci_bus_id }}"}',
                '      - alert: {summary: "'
                + name
                + ' on {{ node }}", labels: {team: "t'
                + str(i % 7)
                + '"}}',
            )
        )
        out += [
            f"  - name: {name}",
            f"    severity: {rng.choice(('info', 'warning', 'critical'))}",
            f"    match: {{{match}}}",
            *stateful,
            "    actions:",
            action,
        ]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------- timing


def best_of(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The shortest wall time of ``repeat`` calls (perf_counter), and the last call's result."""
    best = float("inf")
    result: Any = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>11,.0f}"


def max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [
        "  "
        + "  ".join(
            h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        )
    ]
    lines.append("  " + "  ".join("-" * w for w in widths))
    for r in rows:
        lines.append(
            "  "
            + "  ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    return "\n".join(lines)
