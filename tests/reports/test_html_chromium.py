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
from watchd.reports.core import build_report
from watchd.reports.html import PALETTE, PLOT_BACKGROUNDS, colours, to_html
from watchd.reports.model import Accounting, GpuUse, JobRecord, Observed, ShareRecord

H = 3600.0
T = 1_800_000_000.0


def _report() -> object:
    jobs = []
    waits = {"teama": 30.0, "teamb": 900.0, "teamc": 5 * H}
    sizes = {"teama": 8, "teamb": 4, "teamc": 2}
    for d in range(7):
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
        for d in range(7)
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


def test_chromium_renders_every_plot(tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if real_components_required():
            pytest.fail("chromium required under CI")
        pytest.skip("chromium not installed (apt-get install chromium)")
    report = _report()
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
    shutil.copy(shot, Path("/tmp") / "watchd-usage-report.png")  # for a person to look at
