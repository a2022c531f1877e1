"""dcgm-exporter: parsing a real-shaped page of an 8 x H100 node, and scraping it over HTTP on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.harness.alertmanager import free_port
from tests.support import eventually
from watchd.clock import FakeClock
from watchd.gpu.dcgm import (
    DCGM_FP64_BLANK,
    DCGM_INT32_BLANK,
    DCGM_INT64_BLANK,
    DEFAULT_URL,
    DcgmError,
    DcgmParseError,
    DcgmSource,
    DcgmUnavailable,
    parse_dcgm,
)
from watchd.gpu.dcgm_backend import LOST_AFTER_SCRAPES, DcgmBackend
from watchd.gpu.model import CLOCK_HW_THERMAL, CLOCK_SW_THERMAL, GpuLostError
from watchd.gpu.sampler import GpuSampler
from watchd.httputil import serve
from watchd.model.events import Event

PAGE = (Path(__file__).parent.parent / "data" / "dcgm-exporter.txt").read_text()
NOW = 1_700_000_123.0
MIB = 1024 * 1024
LABELS = 'gpu="0",UUID="GPU-1",pci_bus_id="00000000:9B:00.0",modelName="NVIDIA H100 80GB HBM3"'


def test_blank_constants() -> None:
    assert DCGM_INT32_BLANK == 2147483632
    assert DCGM_INT64_BLANK == 9223372036854775792
    assert DCGM_FP64_BLANK == 140737488355328.0
    assert DEFAULT_URL == "http://127.0.0.1:9400/metrics"


def test_parse_sample_page() -> None:
    scrape = parse_dcgm(PAGE, NOW)
    assert scrape.hostname == "gpu-node-017"
    assert [s.gpu.index for s in scrape.samples] == list(range(8))
    assert [s.gpu.pci_bus_id for s in scrape.samples] == [
        "0000:18:00.0",
        "0000:2a:00.0",
        "0000:3a:00.0",
        "0000:5d:00.0",
        "0000:9a:00.0",
        "0000:ab:00.0",
        "0000:ba:00.0",
        "0000:db:00.0",
    ]
    assert all(s.time == NOW for s in scrape.samples)
    assert all(s.gpu.model == "NVIDIA H100 80GB HBM3" and not s.gpu.mig_mode for s in scrape.samples)
    assert len({s.gpu.uuid for s in scrape.samples}) == 8

    g0 = scrape.samples[0]
    assert g0.gpu.uuid == "GPU-3b9c1e0a-6d8f-2a41-97c2-5e0b8a4f1d63"
    assert g0.util_gpu == 100.0
    assert g0.util_mem == 47.0
    assert g0.mem_used_bytes == 71020 * MIB
    assert g0.mem_total_bytes == 81079 * MIB
    assert g0.temp_c == 41.0
    assert g0.power_w == pytest.approx(612.437)
    assert g0.energy_j == pytest.approx(123456789.012)  # mJ -> J, above the int32 blank: still a value
    assert g0.sm_clock_mhz == 1980.0
    assert g0.clock_event_reasons == 0
    assert (g0.ecc_volatile_corrected, g0.ecc_volatile_uncorrected) == (0, 0)
    assert (g0.ecc_aggregate_corrected, g0.ecc_aggregate_uncorrected) == (0, 0)
    assert (g0.remapped_rows_correctable, g0.remapped_rows_uncorrectable, g0.remap_failure) == (0, 0, False)
    assert g0.pcie_replay_count == 0
    assert g0.pcie_tx_bytes_per_s == 5123456789.0  # bytes/s above the int32 blank: still a value
    assert g0.pcie_rx_bytes_per_s == 6234567890.0
    # not on the page: None, never zero
    assert g0.power_limit_w is None and g0.nvlink_errors is None and g0.remap_pending is None
    assert g0.lost is False and g0.pids == ()

    g2, g3, g4, g5, g6, g7 = scrape.samples[2:]
    assert g2.pcie_replay_count == 17
    assert (g3.ecc_volatile_corrected, g3.ecc_volatile_uncorrected) == (3, 1)
    assert (g3.ecc_aggregate_corrected, g3.ecc_aggregate_uncorrected) == (12, 1)
    assert (g3.remapped_rows_correctable, g3.remapped_rows_uncorrectable) == (2, 1)
    assert g4.pcie_rx_bytes_per_s is None  # NaN
    assert g4.pcie_tx_bytes_per_s == 5111223344.0
    assert g5.clock_event_reasons == CLOCK_SW_THERMAL | CLOCK_HW_THERMAL
    assert (g5.temp_c, g5.sm_clock_mhz) == (87.0, 1410.0)
    assert g6.power_w is None  # fp64 blank
    assert g6.ecc_aggregate_uncorrected is None  # int64 blank
    assert g6.ecc_aggregate_corrected == 0
    assert g7.util_gpu is None  # int32 blank
    assert g7.mem_used_bytes == 0 and g7.mem_total_bytes == 81079 * MIB

    uuids = [s.gpu.uuid for s in scrape.samples]
    assert scrape.last_xids == {u: {3: 79, 5: 13}.get(i, 0) for i, u in enumerate(uuids)}
    assert scrape.nvlink_bandwidth_total[uuids[1]] == 9876543210 + 1111
    assert scrape.nvlink_bandwidth_rate == {}
    assert scrape.by_uuid()[uuids[5]] is g5


def test_lower_case_hostname_label() -> None:
    text = PAGE.replace('Hostname="gpu-node-017"', 'hostname="gpu-node-018"')
    assert "Hostname" not in text.replace("# HELP", "")
    scrape = parse_dcgm(text, NOW)
    assert scrape.hostname == "gpu-node-018"
    assert len(scrape.samples) == 8


def test_no_hostname_label() -> None:
    scrape = parse_dcgm(f"DCGM_FI_DEV_GPU_TEMP{{{LABELS}}} 40\n", NOW)
    assert scrape.hostname is None
    [s] = scrape.samples
    assert (s.gpu.index, s.gpu.uuid, s.gpu.pci_bus_id, s.temp_c) == (0, "GPU-1", "0000:9b:00.0", 40.0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2147483632", None),  # DCGM_INT32_BLANK
        ("2147483646", None),  # DCGM_INT32_NOT_SUPPORTED (blank + 14)
        ("9223372036854775792", None),  # DCGM_INT64_BLANK
        ("9223372036854775794", None),
        ("140737488355328.000000", None),  # DCGM_FP64_BLANK
        ("1.40737488355330e+14", None),
        ("NaN", None),
        ("+Inf", None),
        ("2147483631", 2147483631.0),
        ("55", 55.0),
    ],
)
def test_blank_sentinels(value: str, expected: float | None) -> None:
    [s] = parse_dcgm(f"DCGM_FI_DEV_GPU_TEMP{{{LABELS}}} {value}\n", NOW).samples
    assert s.temp_c == expected


def test_wide_fields_use_the_fp64_blank() -> None:
    text = (
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{LABELS}}} 3000000000\n"
        f"DCGM_FI_PROF_PCIE_TX_BYTES{{{LABELS}}} 9223372036854775792\n"
        f"DCGM_FI_PROF_PCIE_RX_BYTES{{{LABELS}}} 140737488355328\n"
        f"DCGM_FI_PROF_NVLINK_TX_BYTES{{{LABELS}}} 140737488355327\n"
    )
    [s] = parse_dcgm(text, NOW).samples
    assert s.energy_j == 3000000.0
    assert s.pcie_tx_bytes_per_s is None
    assert s.pcie_rx_bytes_per_s is None
    assert s.nvlink_tx_bytes_per_s == 140737488355327.0


def test_clock_event_reasons_preferred_over_throttle_reasons() -> None:
    text = (
        f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{LABELS}}} 1\n"
        f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{LABELS}}} 8\n"
        f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{LABELS}}} 1\n"
        f"DCGM_FI_DEV_ROW_REMAP_PENDING{{{LABELS}}} 0\n"
        f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{LABELS}}} 3\n"
        f"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{{{LABELS}}} 4\n"
        f"DCGM_FI_DEV_FB_USED{{{LABELS}}} 100\n"
        f"DCGM_FI_DEV_FB_FREE{{{LABELS}}} 900\n"
        f"DCGM_FI_DEV_FB_RESERVED{{{LABELS}}} 24\n"
    )
    [s] = parse_dcgm(text, NOW).samples
    assert s.clock_event_reasons == 8
    assert (s.remap_failure, s.remap_pending) == (True, False)
    assert s.nvlink_errors == 7
    assert s.mem_total_bytes == 1024 * MIB


def test_counters_with_type_lines() -> None:
    # prometheus_client names a counter's samples "<name>_total"; the family name must still match.
    text = (
        "# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL Total number of double-bit volatile ECC errors.\n"
        "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n"
        f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{LABELS}}} 2\n"
    )
    [s] = parse_dcgm(text, NOW).samples
    assert s.ecc_volatile_uncorrected == 2


def test_unknown_metrics_and_series_without_uuid_are_ignored() -> None:
    text = (
        "# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines 12\n"
        f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{LABELS}}} 0.5\n"
        'DCGM_FI_DEV_NVSWITCH_TEMPERATURE_CURRENT{nvswitch="0"} 40\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="3"} 40\n'
    )
    scrape = parse_dcgm(text, NOW)
    assert scrape.samples == [] and scrape.last_xids == {} and scrape.hostname is None
    assert parse_dcgm("", NOW).samples == []


def test_mig_instances() -> None:
    whole = 'gpu="1",UUID="GPU-M",pci_bus_id="00000000:1B:00.0",modelName="NVIDIA A100-SXM4-80GB"'
    text = (
        "".join(
            f'DCGM_FI_DEV_FB_USED{{{whole},GPU_I_PROFILE="3g.40gb",GPU_I_ID="{i}"}} {used}\n'
            f'DCGM_FI_DEV_FB_FREE{{{whole},GPU_I_PROFILE="3g.40gb",GPU_I_ID="{i}"}} {40000 - used}\n'
            f'DCGM_FI_DEV_GPU_TEMP{{{whole},GPU_I_PROFILE="3g.40gb",GPU_I_ID="{i}"}} {temp}\n'
            f'DCGM_FI_DEV_XID_ERRORS{{{whole},GPU_I_PROFILE="3g.40gb",GPU_I_ID="{i}"}} {xid}\n'
            for i, used, temp, xid in ((1, 1000, 50, 0), (2, 3000, 51, 43))
        )
        + f"DCGM_FI_DEV_POWER_USAGE{{{whole}}} 250.5\nDCGM_FI_DEV_GPU_TEMP{{{whole}}} 49\n"
    )
    scrape = parse_dcgm(text, NOW)
    [s] = scrape.samples
    assert s.gpu.mig_mode and s.gpu.index == 1 and s.gpu.pci_bus_id == "0000:1b:00.0"
    assert s.mem_used_bytes == 4000 * MIB
    assert s.mem_total_bytes == 80000 * MIB
    assert s.temp_c == 49.0  # a whole-GPU series wins over the instances
    assert s.power_w == 250.5
    assert scrape.last_xids == {"GPU-M": 43}


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>502 Bad Gateway</body></html>",
        f"DCGM_FI_DEV_GPU_TEMP{{{LABELS}}} hot\n",
        'DCGM_FI_DEV_GPU_TEMP{gpu="0} 1\n',
        "# TYPE DCGM_FI_DEV_GPU_TEMP bogus\n",
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",gpu="1"} 1\n',
        "\x00\x01\x02",
    ],
)
def test_malformed_page(text: str) -> None:
    with pytest.raises(DcgmParseError, match="malformed dcgm-exporter exposition"):
        parse_dcgm(text, NOW)


def test_truncated_page_is_an_error_or_a_subset() -> None:
    # a scrape cut mid-line either parses (a shorter page) or raises DcgmParseError: nothing else
    for cut in range(0, len(PAGE), 1231):
        try:
            scrape = parse_dcgm(PAGE[:cut], NOW)
        except DcgmParseError:
            continue
        assert len(scrape.samples) <= 8
        for s in scrape.samples:
            assert s.temp_c is None or not math.isnan(s.temp_c)


# --- over HTTP -------------------------------------------------------------------------------------------


class Exporter:
    def __init__(self) -> None:
        self.body = PAGE
        self.status = 200
        self.delay = 0.0
        self.url = ""
        self.hits = 0
        self.release = asyncio.Event()  # set at teardown: a delayed handler returns at once

    async def metrics(self, _: web.Request) -> web.Response:
        self.hits += 1
        if self.delay:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), self.delay)
        return web.Response(text=self.body, status=self.status, content_type="text/plain")


@pytest.fixture
async def exporter() -> AsyncIterator[Exporter]:
    exp = Exporter()
    app = web.Application()
    app.router.add_get("/metrics", exp.metrics)
    async with serve(app, "127.0.0.1", 0) as port:
        exp.url = f"http://127.0.0.1:{port}/metrics"
        try:
            yield exp
        finally:
            exp.release.set()


async def test_scrape_over_http(exporter: Exporter) -> None:
    clock = FakeClock(NOW)
    async with DcgmSource(exporter.url, timeout=2.0, clock=clock) as dcgm:
        first = await dcgm.scrape()
        assert first == parse_dcgm(PAGE, NOW)
        assert first.hostname == "gpu-node-017" and len(first.samples) == 8
        assert first.nvlink_bandwidth_rate == {}
        # the NVLink counter moved by 5000 on every GPU in 10 s
        uuids = [s.gpu.uuid for s in first.samples]
        bumped = []
        for line in PAGE.splitlines():
            if line.startswith("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{"):
                head, value = line.rsplit(" ", 1)
                line = f"{head} {int(value) + 5000}"
            bumped.append(line)
        exporter.body = "\n".join(bumped) + "\n"
        clock.advance(10.0)
        second = await dcgm.scrape()
        assert second.samples[0].time == NOW + 10.0
        assert second.nvlink_bandwidth_rate == {u: 500.0 for u in uuids}
    assert exporter.hits == 2


async def test_scrape_lower_case_hostname_over_http(exporter: Exporter) -> None:
    exporter.body = PAGE.replace("Hostname=", "hostname=")
    async with DcgmSource(exporter.url) as dcgm:
        assert (await dcgm.scrape()).hostname == "gpu-node-017"


async def test_scrape_http_error(exporter: Exporter) -> None:
    exporter.status = 503
    async with DcgmSource(exporter.url) as dcgm:
        with pytest.raises(DcgmUnavailable, match="answered HTTP 503"):
            await dcgm.scrape()


async def test_scrape_malformed(exporter: Exporter) -> None:
    exporter.body = "<html>not metrics</html>"
    async with DcgmSource(exporter.url) as dcgm:
        with pytest.raises(DcgmParseError, match=r"127\.0\.0\.1.*malformed"):
            await dcgm.scrape()


async def test_scrape_timeout(exporter: Exporter) -> None:
    exporter.delay = 2.0
    async with DcgmSource(exporter.url, timeout=0.2) as dcgm:
        with pytest.raises(DcgmUnavailable, match="timed out"):
            await dcgm.scrape()


async def test_scrape_too_large(exporter: Exporter) -> None:
    async with DcgmSource(exporter.url, max_bytes=1000) as dcgm:
        with pytest.raises(DcgmUnavailable, match="more than 1000 bytes"):
            await dcgm.scrape()


async def test_scrape_unreachable() -> None:
    port = free_port()
    async with DcgmSource(f"http://127.0.0.1:{port}/metrics", timeout=2.0) as dcgm:
        with pytest.raises(DcgmUnavailable, match="unreachable") as info:
            await dcgm.scrape()
    assert isinstance(info.value, DcgmError)


# --- as the agent's GPU backend --------------------------------------------------------------------------


def _lost(events: list[Event], value: int) -> list[Event]:
    return [
        e
        for e in events
        if e.kind == "gpu_health" and e.attrs["condition"] == "gpu_lost" and e.attrs["value"] == value
    ]


async def test_a_gpu_gone_from_the_exporter_page_is_lost_and_back_when_it_returns(exporter: Exporter) -> None:
    gone = [s.gpu for s in parse_dcgm(PAGE, NOW).samples][3]
    without = "\n".join(line for line in PAGE.splitlines() if f'UUID="{gone.uuid}"' not in line) + "\n"
    backend = DcgmBackend(exporter.url, max_age_s=0.0)
    events: list[Event] = []
    sampler = GpuSampler(backend, "gpu-node-017", events.append, interval_s=0.02)
    task = asyncio.create_task(sampler.run())
    try:
        await eventually(lambda: sampler.samples_taken >= 16, what="two rounds of all eight GPUs")
        exporter.status, exporter.body = 503, "busy"  # the exporter away: unknown, not lost
        hits = exporter.hits
        await eventually(lambda: exporter.hits >= hits + 5, what="five failed scrapes")
        exporter.status, exporter.body = 200, without
        await eventually(lambda: bool(_lost(events, 1)), what="the lost GPU reported")
        [lost] = _lost(events, 1)
        assert (lost.attrs["uuid"], lost.attrs["gpu"]) == (gone.uuid, gone.index)
        assert lost.attrs["evidence"] == "dcgm-exporter: GPU gone from its page"
        exporter.body = PAGE
        await eventually(lambda: bool(_lost(events, 0)), what="the GPU back")
        [back] = _lost(events, 0)
        assert back.attrs["uuid"] == gone.uuid
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_one_page_without_a_gpu_is_not_a_lost_gpu() -> None:
    """A short or odd page (a truncated read parses as a subset) never makes a lost GPU on its own: only
    LOST_AFTER_SCRAPES pages in a row do, and one GPU's calls in one round count one page."""
    gone = next(s.gpu for s in parse_dcgm(PAGE, NOW).samples)
    without = "\n".join(line for line in PAGE.splitlines() if f'UUID="{gone.uuid}"' not in line) + "\n"
    backend = DcgmBackend("http://unused", max_age_s=3600.0)
    pages = iter([PAGE, without, PAGE, without, without, without])
    backend._fetch = lambda: parse_dcgm(next(pages), NOW)  # type: ignore[method-assign]
    backend.open()
    answered = []
    for _ in range(4):
        backend._scraped_at = -1e9  # the next call reads the next page
        answered.append(backend.sample(gone, NOW).util_gpu is not None)
        answered.append(backend.sample(gone, NOW).util_gpu is not None)  # the same page again
    assert answered == [False, False, True, True, False, False, False, False]
    backend._scraped_at = -1e9
    assert LOST_AFTER_SCRAPES == 3
    with pytest.raises(GpuLostError, match=f"{gone.uuid}.*missing from http://unused in 3 pages in a row"):
        backend.sample(gone, NOW)
