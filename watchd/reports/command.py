"""``watchd report usage``: fetch accounting, read what watchd observed, build, render."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO, cast

from watchd.errors import UsageError
from watchd.model.durations import parse_duration
from watchd.progress import progress
from watchd.reports.core import build_report
from watchd.reports.formats import REPORT_FORMATS
from watchd.reports.model import DIMENSIONS, Observed, UsageReport
from watchd.reports.settings import ReportsConfig
from watchd.reports.source import AccountingSource, build_source


def parse_by(text: str) -> tuple[str, ...]:
    dims = tuple(d.strip() for d in text.split(",") if d.strip())
    bad = [d for d in dims if d not in DIMENSIONS]
    if not dims or bad:
        raise UsageError(f"--by {text!r}: use a comma list of {', '.join(DIMENSIONS)}")
    return dims


def window(since: str, until: str | None, now: float) -> tuple[float, float]:
    try:
        start = now - parse_duration(since)
        end = now - (parse_duration(until) if until else 0.0)
    except ValueError as exc:
        raise UsageError(f"--since/--until: {exc}") from None
    if end <= start:
        raise UsageError("--since must reach further back than --until")
    return start, end


def observed_from(state: Path | None, start: float, end: float) -> Observed:
    if state is None:
        return Observed()
    if not state.exists():
        raise UsageError(f"{state}: no such state database (the engine's state.path)")
    from watchd.reports.observed import load_observed
    from watchd.store.database import Store

    store = Store.open(state)
    try:
        return load_observed(store, start, end)
    finally:
        store.close()


def make_report(
    source: AccountingSource,
    observed: Observed,
    *,
    start: float,
    end: float,
    now: float,
    by: Sequence[str],
    idle_util_pct: float,
    buckets: int = 14,
) -> UsageReport:
    accounting = source.fetch(start, end)
    return build_report(
        accounting,
        observed,
        start=start,
        end=end,
        now=now,
        by=by,
        idle_util_pct=idle_util_pct,
        buckets=buckets,
    )


def renderer(fmt: str) -> Callable[..., str]:
    """The function rendering format ``fmt`` (a row of :data:`~watchd.reports.formats.REPORT_FORMATS`)."""
    row = REPORT_FORMATS.get(fmt)
    if row is None:
        raise UsageError(f"unknown format {fmt!r} (known: {', '.join(REPORT_FORMATS)})")
    module, _, function = row.renderer.partition(":")
    return cast(Callable[..., str], getattr(importlib.import_module(module), function))


def render(report: UsageReport, fmt: str, max_accounts: int = 50) -> str:
    options = {"max_accounts": max_accounts}
    return renderer(fmt)(report, **{k: options[k] for k in REPORT_FORMATS[fmt].options})


def run_usage(  # cfg, state, slurm_conf, squeue: from the engine config, when it was given
    *,
    since: str,
    until: str | None,
    by: str,
    fmt: str,
    source: str | None,
    fixture: Path | None,
    state: Path | None,
    cfg: ReportsConfig | None,
    idle_util_pct: float | None,
    output: Path | None,
    out: TextIO,
    err: TextIO,
    slurm_conf: Path | None = None,
    squeue: str = "squeue",
) -> int:
    now = time.time()
    start, end = window(since, until, now)
    dims = parse_by(by)
    src = build_source(
        source or (cfg.source if cfg else "slurm"),
        fixture=fixture,
        timeout_s=cfg.timeout_s if cfg else 300.0,
        slurm_conf=slurm_conf,
        squeue=squeue,
    )
    idle = idle_util_pct if idle_util_pct is not None else (cfg.idle_util_pct if cfg else 5.0)
    with progress("report usage: reading accounting and what watchd observed", err):
        report = make_report(
            src, observed_from(state, start, end), start=start, end=end, now=now, by=dims, idle_util_pct=idle
        )
    if not report.accounting:
        print(
            f"watchd report usage: accounting unavailable ({report.accounting_note}); "
            "showing what watchd observed itself",
            file=err,
        )
    text = render(report, fmt, cfg.max_accounts if cfg else 50)
    if output is not None:
        try:
            output.write_text(text)
        except OSError as exc:
            raise UsageError(f"{output}: cannot write: {exc.strerror}") from None
    else:
        out.write(text)
    return 0
