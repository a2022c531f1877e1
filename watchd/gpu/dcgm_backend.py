"""dcgm-exporter as a GPU backend: the sampler reads a node's dcgm-exporter instead of NVML.

Blocking, like every backend (the sampler calls it from a worker thread): one scrape per sampling round,
shared by the GPUs of the round. DCGM's last-Xid gauge becomes Xid notices when its value changes.

A GPU the exporter listed at start that is missing from :data:`LOST_AFTER_SCRAPES` of its pages in a row is
lost (DCGM stops reporting a GPU that fell off the bus), as NVML's GpuIsLost; it answers again when it is back
on the page. A page that could not be read is no evidence either way: every field unknown, nothing lost.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

from watchd.gpu.backend import XidNotice
from watchd.gpu.dcgm import DEFAULT_URL, DcgmError, DcgmScrape, parse_dcgm
from watchd.gpu.model import BackendUnavailable, GpuIdentity, GpuLostError, GpuSample

_MAX_BYTES = 32 * 1024 * 1024
#: consecutive pages without a GPU before it is lost: one short or odd page never drains a node
LOST_AFTER_SCRAPES = 3


class DcgmBackend:
    name = "dcgm"

    def __init__(self, url: str = DEFAULT_URL, timeout_s: float = 5.0, max_age_s: float = 1.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self._scrape: DcgmScrape | None = None
        self._scraped_at = 0.0
        self._xids_seen: dict[str, int] | None = None
        self._gpus: dict[str, GpuIdentity] = {}
        self._missing: dict[str, tuple[DcgmScrape, int]] = {}  # uuid -> the last page without it, how many
        self._lock = threading.Lock()

    def _fetch(self) -> DcgmScrape:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
                text = resp.read(_MAX_BYTES).decode("utf-8", "replace")
        except (urllib.error.URLError, OSError) as exc:
            raise DcgmError(f"{self.url}: {getattr(exc, 'reason', exc)}") from None
        return parse_dcgm(text, time.time())

    def _current(self) -> DcgmScrape:
        with self._lock:
            if self._scrape is None or time.monotonic() - self._scraped_at > self.max_age_s:
                self._scrape = self._fetch()
                self._scraped_at = time.monotonic()
            return self._scrape

    def open(self) -> list[GpuIdentity]:
        try:
            scrape = self._current()
        except DcgmError as exc:
            raise BackendUnavailable(f"dcgm-exporter: {exc}") from None
        self._gpus = {s.gpu.uuid: s.gpu for s in scrape.samples}
        self._xids_seen = dict(scrape.last_xids)
        return [s.gpu for s in scrape.samples]

    def sample(self, gpu: GpuIdentity, now: float) -> GpuSample:
        try:
            scrape = self._current()
        except DcgmError:
            return GpuSample(time=now, gpu=gpu)  # the exporter is away this round: unknown, not a lost GPU
        found = scrape.by_uuid().get(gpu.uuid)
        if found is None:
            last, misses = self._missing.get(gpu.uuid, (None, 0))
            if last is not scrape:  # count pages, not the calls of one round
                misses += 1
                self._missing[gpu.uuid] = (scrape, misses)
            if misses >= LOST_AFTER_SCRAPES:
                raise GpuLostError(
                    f"GPU {gpu.index} ({gpu.uuid}, {gpu.pci_bus_id}) missing from {self.url} in {misses} "
                    "pages in a row"
                )
            return GpuSample(time=now, gpu=gpu)
        self._missing.pop(gpu.uuid, None)
        return GpuSample(**{**{f: getattr(found, f) for f in found.__slots__}, "time": now, "gpu": gpu})

    def wait_xids(self, timeout_s: float) -> list[XidNotice]:
        time.sleep(timeout_s)
        try:
            latest = self._current().last_xids
        except DcgmError:
            return []
        seen = self._xids_seen or {}
        notices = [
            XidNotice(self._gpus[uuid], xid, "reported by DCGM (DCGM_FI_DEV_XID_ERRORS)")
            for uuid, xid in latest.items()
            if xid and xid != seen.get(uuid) and uuid in self._gpus
        ]
        self._xids_seen = dict(latest)
        return notices

    def close(self) -> None:
        self._scrape = None
