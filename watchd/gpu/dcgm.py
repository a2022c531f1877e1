"""dcgm-exporter as an optional GPU source: scrape its ``/metrics`` page and turn it into :class:`GpuSample`.

:func:`parse_dcgm` is pure (text + time -> :class:`DcgmScrape`); :class:`DcgmSource` fetches the page over
HTTP with a timeout. The caller decides the interval.

Series are keyed by the ``UUID`` label (series without one, e.g. NVSwitch metrics, are ignored), identity
comes from ``gpu``, ``pci_bus_id`` (normalized), ``modelName``; the node from ``Hostname`` or ``hostname``.
Unknown metrics are ignored. DCGM's "blank" sentinels (no data / not supported) and NaN become None.

MIG: series carrying a ``GPU_I_ID`` label describe one GPU instance. A whole-GPU series always wins; when only
instance series exist for a field, framebuffer sizes are summed over the instances and every other field takes
the largest instance value (device-level values are repeated per instance).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from watchd.clock import Clock, SystemClock
from watchd.gpu.model import GpuIdentity, GpuSample
from watchd.model.jobs import pod_job_label
from watchd.xid.pci import normalize_pci

__all__ = [
    "DCGM_FP64_BLANK",
    "DCGM_INT32_BLANK",
    "DCGM_INT64_BLANK",
    "DEFAULT_URL",
    "DcgmError",
    "DcgmParseError",
    "DcgmScrape",
    "DcgmSource",
    "DcgmUnavailable",
    "parse_dcgm",
]

DEFAULT_URL = "http://127.0.0.1:9400/metrics"

# dcgm_structs.h: values at or above these mean "blank" (no value / not supported / not found / ...).
DCGM_INT32_BLANK = 0x7FFFFFF0  # 2147483632
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0  # 9223372036854775792
DCGM_FP64_BLANK = 140737488355328.0  # 2**47

_MIB = 1024 * 1024


class DcgmError(Exception):
    """dcgm-exporter could not be read; the message says why in one line."""


class DcgmParseError(DcgmError, ValueError):
    """The page is not a valid Prometheus text exposition."""


class DcgmUnavailable(DcgmError):
    """The endpoint did not answer (refused, timed out) or answered with an HTTP error."""


@dataclass(frozen=True, slots=True)
class DcgmScrape:
    """One scrape. ``samples`` are ordered by GPU index; the dicts are keyed by GPU UUID."""

    samples: list[GpuSample]
    #: DCGM_FI_DEV_XID_ERRORS: the last Xid seen on the GPU (0: none since DCGM started). A gauge: an Xid
    #: shows as a change of value; the same Xid repeated is invisible here (kmsg/NVML events see it).
    last_xids: dict[str, int] = field(default_factory=dict)
    hostname: str | None = None
    #: DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL: a raw counter over all links (GpuSample has no field for it).
    nvlink_bandwidth_total: dict[str, float] = field(default_factory=dict)
    #: Per-second rate of ``nvlink_bandwidth_total`` between this scrape and the previous one of the same
    #: :class:`DcgmSource` (counter units per second; absent on the first scrape and after a counter reset).
    nvlink_bandwidth_rate: dict[str, float] = field(default_factory=dict)

    def by_uuid(self) -> dict[str, GpuSample]:
        return {s.gpu.uuid: s for s in self.samples}


def _float(v: float) -> float:
    return float(v)


def _int(v: float) -> int:
    return int(v)


def _bool(v: float) -> bool:
    return v != 0


def _mib(v: float) -> int:
    return int(v) * _MIB


def _mj(v: float) -> float:
    return v / 1000.0


# metric -> (GpuSample attribute, conversion, wide). The first metric listed for an attribute wins when a page
# has several (DCGM renamed throttle reasons to clock-event reasons). "Wide" values may legitimately exceed
# the int32 blank (energy in mJ passes 2**31 after ~50 min at 700 W; PCIe bytes/s): for them only values at or
# above the fp64 blank (2**47, which the int64 blank also exceeds) are blank. For every other field anything
# at or above the int32 blank is.
_FIELDS: dict[str, tuple[str, Callable[[float], Any], bool]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_gpu", _float, False),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("util_mem", _float, False),
    "DCGM_FI_DEV_ENC_UTIL": ("util_enc", _float, False),
    "DCGM_FI_DEV_DEC_UTIL": ("util_dec", _float, False),
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", _mib, False),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", _float, False),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", _float, False),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit_w", _float, False),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("power_limit_w", _float, False),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", _mj, True),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", _float, False),
    "DCGM_FI_DEV_MAX_SM_CLOCK": ("sm_clock_max_mhz", _float, False),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clock_event_reasons", _int, False),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("clock_event_reasons", _int, False),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_volatile_corrected", _int, False),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_volatile_uncorrected", _int, False),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_aggregate_corrected", _int, False),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_aggregate_uncorrected", _int, False),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", _int, False),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", _int, False),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remap_pending", _bool, False),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remap_failure", _bool, False),
    "DCGM_FI_DEV_RETIRED_PENDING": ("retired_pages_pending", _bool, False),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay_count", _int, False),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("pcie_link_gen", _int, False),
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": ("pcie_link_gen_max", _int, False),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("pcie_link_width", _int, False),
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": ("pcie_link_width_max", _int, False),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_per_s", _float, True),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_per_s", _float, True),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_bytes_per_s", _float, True),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_bytes_per_s", _float, True),
}
_FB_FREE = "DCGM_FI_DEV_FB_FREE"
_FB_TOTAL = "DCGM_FI_DEV_FB_TOTAL"
_FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
_XID = "DCGM_FI_DEV_XID_ERRORS"
_NVLINK_BW = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
# Summed into GpuSample.nvlink_errors.
_NVLINK_ERRORS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
_EXTRA_NARROW = frozenset({_FB_FREE, _FB_TOTAL, _FB_RESERVED, _XID, *_NVLINK_ERRORS})
_EXTRA_WIDE = frozenset({_NVLINK_BW})
_SUMMED_OVER_INSTANCES = frozenset({"DCGM_FI_DEV_FB_USED", _FB_FREE, _FB_TOTAL, _FB_RESERVED})


def _is_blank(value: float, wide: bool) -> bool:
    if math.isnan(value):
        return True
    return value >= (DCGM_FP64_BLANK if wide else DCGM_INT32_BLANK)


def _wide(name: str) -> bool | None:
    """Whether ``name`` is a wide metric; None when it is not one we read."""
    spec = _FIELDS.get(name)
    if spec is not None:
        return spec[2]
    if name in _EXTRA_NARROW:
        return False
    if name in _EXTRA_WIDE:
        return True
    return None


@dataclass(slots=True)
class _Gpu:
    index: int
    uuid: str
    pci_bus_id: str
    model: str
    mig: bool = False
    whole: dict[str, float] = field(default_factory=dict)
    instances: dict[str, list[float]] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)  # job label from the pod labels -> series count

    def value(self, name: str) -> float | None:
        if name in self.whole:
            return self.whole[name]
        values = self.instances.get(name)
        if not values:
            return None
        return sum(values) if name in _SUMMED_OVER_INSTANCES else max(values)


def _index(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1


def parse_dcgm(text: str, now: float) -> DcgmScrape:
    """Parse a dcgm-exporter page read at ``now`` (seconds since the epoch) into one sample per GPU.

    Raises :class:`DcgmParseError` when ``text`` is not a valid Prometheus text exposition. An empty page
    gives an empty scrape.
    """
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError mostly, but is not documented to raise only that
        raise DcgmParseError(f"malformed dcgm-exporter exposition: {e}") from e

    gpus: dict[str, _Gpu] = {}
    hostname: str | None = None
    for family in families:
        for s in family.samples:
            # prometheus_client names a counter's samples "<name>_total": look the family name up too.
            name = s.name if _wide(s.name) is not None else family.name
            wide = _wide(name)
            if wide is None:
                continue
            labels = s.labels
            uuid = labels.get("UUID", "")
            if not uuid:
                continue
            if hostname is None:
                hostname = labels.get("Hostname") or labels.get("hostname") or None
            gpu = gpus.get(uuid)
            if gpu is None:
                gpu = gpus[uuid] = _Gpu(
                    index=_index(labels.get("gpu", "")),
                    uuid=uuid,
                    pci_bus_id=normalize_pci(labels.get("pci_bus_id", "")) or "",
                    model=labels.get("modelName", ""),
                )
            value = float(s.value)
            pod = labels.get("pod") or labels.get("pod_name") or ""
            if pod:  # Kubernetes mode (-k): the pod using this GPU (or GPU instance)
                ns = labels.get("namespace") or labels.get("pod_namespace") or ""
                job = pod_job_label(ns, pod)
                if job is not None:
                    gpu.jobs[job] = gpu.jobs.get(job, 0) + 1
            instance = labels.get("GPU_I_ID", "")
            if instance:
                gpu.mig = True
            if _is_blank(value, wide):
                continue
            if instance:
                gpu.instances.setdefault(name, []).append(value)
            else:
                gpu.whole.setdefault(name, value)

    samples: list[GpuSample] = []
    last_xids: dict[str, int] = {}
    nvlink_bw: dict[str, float] = {}
    for gpu in sorted(gpus.values(), key=lambda g: (g.index, g.uuid)):
        samples.append(_sample(gpu, now))
        xid = gpu.value(_XID)
        if xid is not None:
            last_xids[gpu.uuid] = int(xid)
        bw = gpu.value(_NVLINK_BW)
        if bw is not None:
            nvlink_bw[gpu.uuid] = bw
    return DcgmScrape(
        samples=samples, last_xids=last_xids, hostname=hostname, nvlink_bandwidth_total=nvlink_bw
    )


def _sample(gpu: _Gpu, now: float) -> GpuSample:
    kwargs: dict[str, Any] = {}
    for name, (attr, convert, _) in _FIELDS.items():
        if attr in kwargs:
            continue
        value = gpu.value(name)
        if value is not None:
            kwargs[attr] = convert(value)
    total = gpu.value(_FB_TOTAL)
    if total is None:
        used, free = gpu.value("DCGM_FI_DEV_FB_USED"), gpu.value(_FB_FREE)
        if used is not None and free is not None:
            total = used + free + (gpu.value(_FB_RESERVED) or 0.0)
    if total is not None:
        kwargs["mem_total_bytes"] = _mib(total)
    errors = [v for v in (gpu.value(n) for n in _NVLINK_ERRORS) if v is not None]
    if errors:
        kwargs["nvlink_errors"] = int(sum(errors))
    if gpu.jobs:  # the job most series name (MIG: instances may run different pods)
        kwargs["job"] = min(gpu.jobs, key=lambda j: (-gpu.jobs[j], j))
    identity = GpuIdentity(
        index=gpu.index, uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id, model=gpu.model, mig_mode=gpu.mig
    )
    return GpuSample(time=now, gpu=identity, **kwargs)


class DcgmSource:
    """Scrapes dcgm-exporter. Use as an async context manager (or call :meth:`close`)::

        async with DcgmSource() as dcgm:
            scrape = await dcgm.scrape()  # DcgmUnavailable / DcgmParseError on failure

    ``timeout`` bounds one whole scrape (connect + read). Parsing runs in a worker thread: a page of a large
    MIG node is thousands of lines.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout: float = 5.0,
        clock: Clock | None = None,
        max_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._session: aiohttp.ClientSession | None = None
        self._last_bw: dict[str, tuple[float, float]] = {}  # uuid -> (monotonic time, counter)

    async def __aenter__(self) -> DcgmSource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self) -> str:
        """The raw page. Raises :class:`DcgmUnavailable`."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            async with self._session.get(self.url) as resp:
                if resp.status != 200:
                    raise DcgmUnavailable(f"dcgm-exporter at {self.url} answered HTTP {resp.status}")
                body = await resp.content.read(self.max_bytes + 1)
        except TimeoutError as e:
            raise DcgmUnavailable(f"dcgm-exporter at {self.url} timed out after {self.timeout:g}s") from e
        except aiohttp.ClientError as e:
            raise DcgmUnavailable(f"dcgm-exporter at {self.url} unreachable: {e}") from e
        if len(body) > self.max_bytes:
            raise DcgmUnavailable(f"dcgm-exporter at {self.url} sent more than {self.max_bytes} bytes")
        return body.decode("utf-8", errors="replace")

    async def scrape(self) -> DcgmScrape:
        """Fetch and parse one page. Raises :class:`DcgmUnavailable` or :class:`DcgmParseError`."""
        text = await self.fetch()
        now, mono = self._clock.now(), self._clock.monotonic()
        try:
            scrape = await asyncio.to_thread(parse_dcgm, text, now)
        except DcgmParseError as e:
            raise DcgmParseError(f"dcgm-exporter at {self.url}: {e}") from e
        self._rates(scrape, mono)
        return scrape

    def _rates(self, scrape: DcgmScrape, mono: float) -> None:
        last, self._last_bw = self._last_bw, {}
        for uuid, value in scrape.nvlink_bandwidth_total.items():
            self._last_bw[uuid] = (mono, value)
            prev = last.get(uuid)
            if prev is None or mono <= prev[0] or value < prev[1]:
                continue
            scrape.nvlink_bandwidth_rate[uuid] = (value - prev[1]) / (mono - prev[0])
