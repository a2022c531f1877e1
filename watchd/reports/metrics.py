"""The usage report as Prometheus metrics, with bounded cardinality: one series per account and partition
(the ``max_accounts`` accounts with the most GPU-hours; the rest summed as ``account="(other)"``), never per
job; per user only when ``per_user`` is on (then bounded by ``max_accounts`` too)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from watchd.reports.model import UsageReport

OTHER = "(other)"
#: (metric name, help, row attribute, scale to base units: seconds and joules, as promtool wants them)
_FIELDS = (
    (
        "gpu_seconds",
        "GPU-seconds allocated in the report window (Slurm accounting TRES)",
        "gpu_hours",
        3600.0,
    ),
    (
        "idle_gpu_seconds",
        "GPU-seconds allocated while GPU utilization was under the idle threshold",
        "idle_gpu_hours",
        3600.0,
    ),
    (
        "lost_gpu_seconds",
        "GPU-seconds of work lost to infrastructure faults (since the last checkpoint)",
        "lost_gpu_hours",
        3600.0,
    ),
    ("energy_joules", "GPU energy attributed to the jobs (agents' per-GPU power)", "energy_kwh", 3.6e6),
    ("pending_jobs", "jobs pending now", "pending", 1.0),
    ("pending_gpus", "GPUs requested by the jobs pending now", "pending_gpus", 1.0),
    ("jobs_started", "job runs started in the report window", "jobs", 1.0),
)


def _bounded(report: UsageReport, max_accounts: int) -> set[str]:
    totals: dict[str, float] = defaultdict(float)
    for r in report.rows:
        totals[r.key.get("account", "")] += r.gpu_hours
    ranked = sorted(totals, key=lambda a: (-totals[a], a))
    return set(ranked[:max_accounts])


def families(report: UsageReport, *, max_accounts: int = 50, prefix: str = "watchd_usage") -> list[Metric]:
    """Metric families for a report grouped by account and partition (and user when it has that column)."""
    keep = _bounded(report, max_accounts)
    per_user = "user" in report.by
    labels = ["account", "partition"] + (["user"] if per_user else [])
    sums: dict[str, dict[tuple[str, ...], float]] = {f[0]: defaultdict(float) for f in _FIELDS}
    waits: dict[tuple[str, ...], dict[str, float]] = {}
    for r in report.rows:
        account = r.key.get("account", "")
        if account not in keep:
            account = OTHER
        key = (account, r.key.get("partition", ""), *([r.key.get("user", "")] if per_user else []))
        for name, _, attr, scale in _FIELDS:
            v = getattr(r, attr)
            if v is None:
                continue
            sums[name][key] += float(v) * scale
        if account != OTHER and r.wait_p50_s is not None:
            waits[key] = {"p50": r.wait_p50_s, "p95": r.wait_p95_s or 0.0, "max": r.wait_max_s or 0.0}
    out: list[Metric] = []
    for name, doc, _, _ in _FIELDS:
        g = GaugeMetricFamily(f"{prefix}_{name}", doc, labels=labels)
        for key, v in sorted(sums[name].items()):
            g.add_metric(list(key), v)
        out.append(g)
    w = GaugeMetricFamily(
        f"{prefix}_queue_wait_seconds",
        "queue wait (submit to start) of the runs started in the window",
        labels=[*labels, "stat"],
    )
    for key, qs in sorted(waits.items()):
        for q, v in qs.items():
            w.add_metric([*key, q], v)
    out.append(w)
    shares = GaugeMetricFamily(
        f"{prefix}_norm_shares", "the account's normalized shares (sshare)", labels=["account"]
    )
    factor = GaugeMetricFamily(
        f"{prefix}_fairshare", "the account's mean fair-share factor (sshare)", labels=["account"]
    )
    eff = GaugeMetricFamily(
        f"{prefix}_effective_usage", "the account's effective usage (sshare)", labels=["account"]
    )
    seen: set[str] = set()
    for r in report.rows:
        account = r.key.get("account", "")
        if account not in keep or account in seen or "user" in r.key:
            continue
        seen.add(account)
        if r.norm_shares is not None:
            shares.add_metric([account], r.norm_shares)
        if r.fairshare is not None:
            factor.add_metric([account], r.fairshare)
        if r.effective_usage is not None:
            eff.add_metric([account], r.effective_usage)
    out += [shares, factor, eff]
    up = GaugeMetricFamily(f"{prefix}_accounting_available", "1 when the report came from Slurm accounting")
    up.add_metric([], 1.0 if report.accounting else 0.0)
    window = GaugeMetricFamily(f"{prefix}_window_seconds", "the length of the report window")
    window.add_metric([], report.end - report.start)
    out += [up, window]
    return out


class UsageCollector(Collector):
    """Serves the latest report's families (set by the periodic job) from a registry."""

    def __init__(self, max_accounts: int = 50) -> None:
        self.max_accounts = max_accounts
        self._families: list[Metric] = []

    def update(self, report: UsageReport) -> None:
        self._families = families(report, max_accounts=self.max_accounts)

    def collect(self) -> Iterable[Metric]:
        return list(self._families)


def to_prometheus(report: UsageReport, *, max_accounts: int = 50) -> str:
    """The text exposition format (for node-exporter's textfile collector or ``promtool check metrics``)."""
    reg = CollectorRegistry()
    c = UsageCollector(max_accounts)
    c.update(report)
    reg.register(c)
    return generate_latest(reg).decode()
