"""The agent's GPU loop: read every GPU each interval (in a thread: NVML calls block), derive health events
and window summaries, keep the metrics current, and turn NVML's Xid events into events too."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from watchd.clock import Clock, SystemClock
from watchd.gpu.backend import GpuBackend
from watchd.gpu.health import HealthDeriver
from watchd.gpu.jobs import JobResolver
from watchd.gpu.metrics import GpuCollector
from watchd.gpu.model import BackendUnavailable, GpuIdentity, GpuLostError, GpuSample
from watchd.gpu.summary import WindowSummarizer
from watchd.logs import get_logger
from watchd.model.events import Event, stable_id
from watchd.model.xid import Xid

_log = get_logger("watchd.gpu")

Emit = Callable[[Event], None]
#: (pci_bus_id, xid, source, gpu_instance, compute_instance) -> keep it
XidFilter = Callable[[str, int, str, int | None, int | None], bool]


class GpuSampler:
    def __init__(
        self,
        backend: GpuBackend,
        node: str,
        emit: Emit,
        *,
        interval_s: float = 2.0,
        summary_window_s: float = 5.0,
        health_report_interval_s: float = 30.0,
        collector: GpuCollector | None = None,
        jobs: JobResolver | None = None,
        xid_filter: XidFilter | None = None,
        on_up: Callable[[bool], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.backend = backend
        self.node = node
        self._emit = emit
        self.interval_s = interval_s
        self._clock = clock or SystemClock()
        self.collector = collector
        self._jobs = jobs
        self._xid_filter = xid_filter or (lambda pci, xid, source, gi, ci: True)
        self._on_up = on_up or (lambda up: None)
        self.health = HealthDeriver(source=backend.name, report_interval_s=health_report_interval_s)
        self.summaries = WindowSummarizer(window_s=summary_window_s, source=backend.name)
        self.gpus: list[GpuIdentity] = []
        self.samples_taken = 0
        # held around each blocking call of the backend: a pause (a GPU reset) takes both
        self._sampling = asyncio.Lock()
        self._waiting = asyncio.Lock()
        self._open = False

    async def run(self) -> None:
        try:
            self.gpus = await asyncio.to_thread(self.backend.open)
        except BackendUnavailable as exc:
            _log.warning("gpu_backend_unavailable", backend=self.backend.name, reason=str(exc))
            self._on_up(False)
            return
        self._on_up(True)
        self._open = True
        _log.info("gpu_backend_open", backend=self.backend.name, gpus=len(self.gpus))
        xids = asyncio.create_task(self._watch_xids(), name="gpu-xids")
        try:
            while True:
                started = self._clock.monotonic()
                async with self._sampling:
                    samples = await asyncio.to_thread(self._sample_all, self._clock.now())
                self.observe(samples)
                await asyncio.sleep(max(0.0, self.interval_s - (self._clock.monotonic() - started)))
        finally:
            xids.cancel()
            await asyncio.gather(xids, return_exceptions=True)
            for event in self.summaries.flush(self.node):
                self._emit(event)
            async with self._sampling, self._waiting:
                self._open = False
                await asyncio.to_thread(self.backend.close)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """No backend call while inside (a GPU reset: NVML open in the agent would make nvidia-smi refuse
        it); the backend is closed on entry and opened again on exit, which enumerates the GPUs again."""
        async with self._sampling, self._waiting:
            if not self._open:
                yield
                return
            await asyncio.to_thread(self.backend.close)
            _log.info("gpu_sampling_paused", backend=self.backend.name)
            try:
                yield
            finally:
                try:
                    self.gpus = await asyncio.to_thread(self.backend.open)
                    _log.info("gpu_backend_open", backend=self.backend.name, gpus=len(self.gpus))
                except BackendUnavailable as exc:
                    self.gpus = []
                    _log.error("gpu_backend_unavailable", backend=self.backend.name, reason=str(exc))

    def _sample_all(self, now: float) -> list[GpuSample]:
        out = []
        for gpu in self.gpus:
            try:
                out.append(self.backend.sample(gpu, now))
            except GpuLostError:
                out.append(GpuSample(time=now, gpu=gpu, lost=True))
        return out

    def observe(self, samples: list[GpuSample]) -> None:
        """Derive events from one round of samples (also used directly by the fleet simulator)."""
        for sample in samples:
            self.samples_taken += 1
            job = sample.job  # dcgm-exporter: from the pod labels
            if job is None and self._jobs is not None and sample.pids:
                ref = self._jobs.jobs_for(sample.pids)
                job = ref.label if ref is not None else None
            for event in self.health.observe(sample, self.node):
                self._emit(event)
            for event in self.summaries.observe(sample, self.node, job):
                self._emit(event)
            if self.collector is not None:
                self.collector.update(sample, job)

    async def _watch_xids(self) -> None:
        while True:
            try:
                async with self._waiting:
                    found = await asyncio.to_thread(self.backend.wait_xids, 1.0)
            except Exception as exc:  # events unsupported or the library broke: the kernel log still has them
                _log.warning("gpu_xid_events_unavailable", backend=self.backend.name, error=str(exc))
                return
            now = self._clock.now()
            for gpu, xid, text, gi, ci in found:
                if not self._xid_filter(gpu.pci_bus_id, xid, self.backend.name, gi, ci):
                    continue
                instance = () if gi is None else (gi, ci)  # two MIG instances' Xids: two ids
                self._emit(
                    Xid.build(
                        xid=xid,
                        pci_bus_id=gpu.pci_bus_id,
                        uuid=gpu.uuid,
                        gpu=gpu.index,
                        gpu_instance=gi,
                        compute_instance=ci,
                        message=text,
                    ).to_event(
                        id=stable_id(self.node, self.backend.name, "xid", gpu.uuid, xid, now, *instance),
                        node=self.node,
                        source=self.backend.name,
                        time=now,
                    )
                )
