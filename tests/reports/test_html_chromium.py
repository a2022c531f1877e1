"""The HTML report is self-contained and shows its plots: rendered by headless Chromium (no network), the
screenshot is counted pixel by pixel for each plot's background and for each account's colour."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from tests.support import real_components_required
from watchd.reports import html as plot
from watchd.reports.core import build_report
from watchd.reports.html import NO_DATA, PALETTE, PLOT_BACKGROUNDS, colours, to_html
from watchd.reports.model import Accounting, GpuUse, JobRecord, Observed, ShareRecord

H = 3600.0
T = 1_800_000_000.0


def _report(days: tuple[int, ...] = tuple(range(7))) -> object:
    jobs = []
    waits = {"teama": 30.0, "teamb": 900.0, "teamc": 5 * H}
    sizes = {"teama": 8, "teamb": 4, "teamc": 2}
    for d in days:
        for k, account in enumerate(("teama", "teamb", "teamc")):
            start = T + d * 86400 + k * H
            jobs.append(
                JobRecord(
                    f"{d}{k}",
                    account,
                    "u",
                    "gpu",
                    sizes[account],
                    start - waits[account] * (1 + d % 3),
                    start,
                    start + (6 + 2 * k) * H,
                    "COMPLETED",
                    ("n1",),
                )
            )
    shares = tuple(
        ShareRecord(a, None, s, f, None, None, None, 1.0)
        for a, s, f in (("teama", 50, 0.5), ("teamb", 30, 0.3), ("teamc", 20, 0.2))
    )
    gpus = tuple(
        GpuUse(f"{d}{k}", "n1", 0, (3 - k) * 1e8, 6 * H, H, T + d * 86400, T + d * 86400 + 6 * H)
        for d in days
        for k in range(3)
    )
    return build_report(
        Accounting(True, jobs=tuple(jobs), shares=shares),
        Observed(gpus=gpus),
        start=T,
        end=T + 7 * 86400,
        now=T + 7 * 86400,
    )


def test_html_is_self_contained() -> None:
    page = to_html(_report())  # type: ignore[arg-type]
    assert page.count("<svg") == 3
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "an external resource"
    assert "<script" not in page


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


def _screenshot(report: object, tmp_path: Path) -> Image.Image:
    """The page of ``report`` as headless Chromium draws it, 1000 x 1250 pixels."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if real_components_required():
            pytest.fail("chromium required under CI")
        pytest.skip("chromium not installed (apt-get install chromium)")
    page = tmp_path / "usage.html"
    page.write_text(to_html(report))  # type: ignore[arg-type]
    shot = tmp_path / "usage.png"
    res = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1000,1250",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1000, 1250)
    return img


def test_chromium_renders_every_plot(tmp_path: Path) -> None:
    report = _report()
    img = _screenshot(report, tmp_path)
    counts = Counter(img.get_flattened_data())
    total = img.size[0] * img.size[1]
    assert counts[(255, 255, 255)] < 0.9 * total, "blank page"
    # each plot's background: most of its 860 x 300 area (bars, lines and text cover some)
    for kind, bg in PLOT_BACKGROUNDS.items():
        assert counts[_rgb(bg)] > 0.3 * 860 * 300, f"plot {kind} not drawn ({counts[_rgb(bg)]} px)"
    # each account's colour: its lines, bars and legend swatches, in proportion to what it drew
    col = colours(report)  # type: ignore[arg-type]
    assert set(col.values()) == set(PALETTE[:3])
    for account, c in col.items():
        assert counts[_rgb(c)] > 2000, f"{account} ({c}) hardly visible: {counts[_rgb(c)]} px"
    # the energy bars are proportional: teama used the most, so its colour covers more than teamc's
    assert counts[_rgb(col["teama"])] > counts[_rgb(col["teamc"])]
    img.save(Path("/tmp") / "watchd-usage-report.png")  # for a person to look at


def test_a_period_without_data_is_no_line_at_zero(tmp_path: Path) -> None:
    """Days 2 to 4 without any job: the usage plot shows them as no data (a grey band, the lines broken),
    not as every account at 0 %."""
    report = _report(days=(0, 1, 5, 6))
    img = _screenshot(report, tmp_path)
    # where the usage plot is on the page: the box of its background's pixels
    bg = _rgb(PLOT_BACKGROUNDS["usage"])
    px = img.load()
    assert px is not None
    xs = [x for x in range(img.size[0]) for y in range(0, img.size[1], 4) if px[x, y] == bg]
    ys = [y for x in range(0, img.size[0], 4) for y in range(img.size[1]) if px[x, y] == bg]
    left, top = min(xs), min(ys)
    assert max(xs) - left + 1 == plot.W and max(ys) - top + 1 == plot.H  # the whole plot, at scale 1
    n = len(report.bucket_starts)  # type: ignore[attr-defined]
    empty = [i for i in range(n) if not any(s[i] for s in report.series.values())]  # type: ignore[attr-defined]
    assert len(empty) >= 4, empty
    accounts = {_rgb(c) for c in colours(report).values()}  # type: ignore[arg-type]
    zero_line = top + plot.H - plot.B  # where 0 % is drawn
    for i in empty:
        x0 = left + plot.L + (plot.W - plot.L - plot.R) * i / n
        x1 = left + plot.L + (plot.W - plot.L - plot.R) * (i + 1) / n
        band = [(x, y) for x in range(int(x0) + 2, int(x1) - 1) for y in range(zero_line - 12, zero_line - 1)]
        colours_there = Counter(px[x, y] for x, y in band)
        assert not accounts & set(colours_there), f"period {i}: an account drawn at 0 % ({colours_there})"
        assert colours_there[_rgb(NO_DATA)] > 0.8 * len(band), f"period {i}: not marked as no data"
    # and the periods with data still carry every account's line
    for account, c in colours(report).items():  # type: ignore[arg-type]
        assert Counter(img.get_flattened_data())[_rgb(c)] > 1000, account


def test_the_table_heads_are_words_not_column_names() -> None:
    """People read words; the CSV's column name is the head's tooltip."""
    page = to_html(_report())  # type: ignore[arg-type]
    heads = re.findall(r'<th title="(\w+)">([^<]*)</th>', page)
    assert ("gpu_hours", "GPU-hours") in heads and ("energy_kwh", "energy (kWh)") in heads
    assert ("share_pct", "target (%)") in heads and len(heads) == 15
    assert [text for _, text in heads if "_" in text] == [], heads
