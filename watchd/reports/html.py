"""The usage report as one self-contained HTML page (no script, no CDN, no external file): the table, and
three plots drawn here as inline SVG — each account's share of the GPU-hours over time against its
fair-share target (dashed), the distribution of queue waits per account, and the GPU energy per account.

Each account keeps one colour in every plot (``PALETTE``, in the order of the report's rows); each plot has
its own light background (``PLOT_BACKGROUNDS``), which the rendering test counts in the screenshot. A period
without any GPU-hours is no share of anyone's: the lines break there, over a grey band (``NO_DATA``)."""

from __future__ import annotations

import html
import time
from collections import defaultdict

from watchd.reports.model import WAIT_LABELS, UsageReport
from watchd.reports.render import COLUMN_TITLES, _columns, _fmt, header

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
PLOT_BACKGROUNDS = {"usage": "#eef4fb", "waits": "#f1f9ee", "energy": "#fdf3e7"}
NO_DATA = "#dcdcdc"  # the periods without GPU-hours in the usage plot
W, H = 860, 300
L, R, T, B = 60, 150, 20, 40


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _accounts(report: UsageReport) -> list[str]:
    seen: dict[str, float] = defaultdict(float)
    for r in report.rows:
        seen[r.key.get("account", "")] += r.gpu_hours
    for a in report.series:
        seen.setdefault(a, 0.0)
    return sorted(seen, key=lambda a: (-seen[a], a))


def colours(report: UsageReport) -> dict[str, str]:
    return {a: PALETTE[i % len(PALETTE)] for i, a in enumerate(_accounts(report))}


def _frame(kind: str, title: str, body: list[str], legend: list[tuple[str, str]]) -> str:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        f'role="img" aria-label="{_e(title)}" class="plot plot-{kind}">',
        f'<rect x="0" y="0" width="{W}" height="{H}" fill="{PLOT_BACKGROUNDS[kind]}"/>',
        f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="#555"/>',
        f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="#555"/>',
        *body,
    ]
    for i, (name, colour) in enumerate(legend):
        y = T + 8 + 18 * i
        parts.append(f'<rect x="{W - R + 12}" y="{y - 9}" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text x="{W - R + 30}" y="{y + 2}" font-size="12">{_e(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def usage_plot(report: UsageReport) -> str:
    """Per bucket, each account's fraction of the bucket's GPU-hours; dashed: its normalized shares."""
    col = colours(report)
    n = len(report.bucket_starts)
    totals = [sum(s[i] for s in report.series.values()) for i in range(n)]
    pw, ph = W - L - R, H - T - B
    body: list[str] = []
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = T + ph * (1 - frac)
        body.append(f'<text x="{L - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{frac:.0%}</text>')
    for i in range(n):
        if totals[i] <= 0:
            body.append(
                f'<rect x="{L + pw * i / n:.1f}" y="{T}" width="{pw / n:.1f}" height="{ph}" fill="{NO_DATA}">'
                "<title>no GPU-hours in this period</title></rect>"
            )
    shares = {r.key.get("account"): r.norm_shares for r in report.rows if r.norm_shares is not None}
    for account, s in report.series.items():
        runs: list[list[tuple[float, float]]] = [[]]
        for i in range(n):
            if totals[i] <= 0:  # no data is not 0 %: the line breaks
                runs.append([])
                continue
            runs[-1].append((L + pw * (i + 0.5) / n, T + ph * (1 - s[i] / totals[i])))
        for run in (r for r in runs if r):
            if len(run) == 1:  # one period between gaps: a dot
                (x, y) = run[0]
                body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{col[account]}"/>')
                continue
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
            body.append(f'<polyline points="{pts}" fill="none" stroke="{col[account]}" stroke-width="4"/>')
        share = shares.get(account)
        if share is not None:
            y = T + ph * (1 - share)
            body.append(
                f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="{col[account]}" '
                'stroke-width="2" stroke-dasharray="8 5"/>'
            )
    for i in range(0, n, max(1, n // 7)):
        x = L + pw * (i + 0.5) / n
        label = time.strftime("%m-%d %H:%M", time.localtime(report.bucket_starts[i]))
        body.append(f'<text x="{x:.1f}" y="{H - B + 16}" font-size="10" text-anchor="middle">{label}</text>')
    legend = [(a, col[a]) for a in report.series]
    if any(t <= 0 for t in totals):
        legend.append(("no data", NO_DATA))
    return _frame("usage", "share of GPU-hours over time against fair-share target", body, legend)


def waits_plot(report: UsageReport) -> str:
    """Per wait bucket, each account's fraction of its runs (grouped bars)."""
    col = colours(report)
    accounts = [a for a in col if a in report.wait_histograms]
    k = len(WAIT_LABELS)
    pw, ph = W - L - R, H - T - B
    group = pw / k
    bar = group * 0.8 / max(1, len(accounts))
    body: list[str] = []
    for j, account in enumerate(accounts):
        counts = report.wait_histograms[account]
        total = sum(counts) or 1
        for i, c in enumerate(counts):
            h = ph * c / total
            x = L + group * i + group * 0.1 + bar * j
            body.append(
                f'<rect x="{x:.1f}" y="{T + ph - h:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{col[account]}"/>'
            )
    for i, label in enumerate(WAIT_LABELS):
        x = L + group * (i + 0.5)
        body.append(f'<text x="{x:.1f}" y="{H - B + 16}" font-size="11" text-anchor="middle">{label}</text>')
    body.append(f'<text x="{L - 6}" y="{T + 4}" font-size="11" text-anchor="end">100%</text>')
    return _frame("waits", "queue wait distribution per account", body, [(a, col[a]) for a in accounts])


def energy_plot(report: UsageReport) -> str:
    """Horizontal bars: kWh per account."""
    col = colours(report)
    energy: dict[str, float] = defaultdict(float)
    for r in report.rows:
        if r.energy_kwh:
            energy[r.key.get("account", "")] += r.energy_kwh
    accounts = [a for a in col if a in energy]
    top = max(energy.values(), default=0.0) or 1.0
    pw, ph = W - L - R, H - T - B
    row_h = ph / max(1, len(accounts))
    body: list[str] = []
    for i, account in enumerate(accounts):
        w = 0.8 * pw * energy[account] / top  # room for the label
        y = T + row_h * i + row_h * 0.15
        body.append(
            f'<rect x="{L}" y="{y:.1f}" width="{w:.1f}" height="{row_h * 0.7:.1f}" fill="{col[account]}"/>'
        )
        body.append(
            f'<text x="{L + w + 6:.1f}" y="{y + row_h * 0.4:.1f}" font-size="11">'
            f"{energy[account]:.2f} kWh</text>"
        )
    if not accounts:
        body.append(f'<text x="{L + 20}" y="{T + 40}" font-size="14">no energy observed by watchd</text>')
    return _frame("energy", "GPU energy per account", body, [(a, col[a]) for a in accounts])


def to_html(report: UsageReport, title: str = "watchd GPU usage") -> str:
    cols = _columns(report)
    head = "".join(f'<th title="{_e(n)}">{_e(COLUMN_TITLES.get(n, n))}</th>' for n, _ in cols)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{_e(_fmt(get(r)))}</td>" for _, get in cols) + "</tr>" for r in report.rows
    )
    pending = "\n".join(
        f"<tr><td>{_e(p.job_id)}</td><td>{_e(p.account)}</td><td>{_e(p.partition)}</td><td>{p.gpus}</td>"
        f"<td>{_e(_fmt(report.end - p.submit))}</td><td>{_e(p.reason)}</td></tr>"
        for p in report.pending[:200]
    )
    lost = "\n".join(
        f"<tr><td>{_e(j.job_id)}</td><td>{_e(j.account)}</td><td>{j.gpus}</td><td>{_e(j.evidence)}</td>"
        f"<td>{_e(j.since_what)}</td><td>{j.gpu_hours:.2f}</td></tr>"
        for j in report.lost_jobs[:200]
    )
    note = "" if report.accounting else f'<p class="warn">{_e(header(report))}</p>'
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 20px; background: #ffffff; color: #222; }}
table {{ border-collapse: collapse; font-size: 12px; margin-bottom: 16px; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; }}
th {{ background: #f0f0f0; }}
.warn {{ color: #a00; font-weight: bold; }}
h2 {{ font-size: 16px; margin: 18px 0 6px; }}
</style></head><body>
<h1>{_e(title)}</h1>
<p>{_e(header(report))}</p>{note}
<h2>Share of GPU-hours over time (solid) against the fair-share target (dashed)</h2>
{usage_plot(report)}
<h2>Queue wait, submit to start, of the runs started in the window (fraction per account)</h2>
{waits_plot(report)}
<h2>GPU energy per account (agents' per-GPU power, attributed to the job on the GPU)</h2>
{energy_plot(report)}
<h2>Per {_e(", ".join(report.by))}</h2>
<table><tr>{head}</tr>
{body}
</table>
<h2>Pending now</h2>
<table><tr><th>job</th><th>account</th><th>partition</th><th>GPUs</th><th>waiting (s)</th><th>reason</th></tr>
{pending}
</table>
<h2>Work lost to infrastructure faults</h2>
<table><tr><th>job</th><th>account</th><th>GPUs</th><th>evidence</th><th>since</th><th>GPU-hours</th></tr>
{lost}
</table>
</body></html>
"""
