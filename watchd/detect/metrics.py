"""The detectors' Prometheus metrics, in the engine's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class DetectorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.fleet_evicted = Counter(
            "watchd_fleet_evicted",
            "Fleet state the detectors keep, evicted to stay within its bounds (node: past "
            "detectors.max_nodes or detectors.max_state_mib) or refused (gpu: an index past "
            "detect.fleet.MAX_GPUS_PER_NODE).",
            ["what"],
            registry=r,
        )
        self.fleet_state_bytes = Gauge(
            "watchd_fleet_state_bytes",
            "Memory the detectors' fleet state takes, as estimated against detectors.max_state_mib.",
            registry=r,
        )
        self.findings = Counter(
            "watchd_findings",
            "Findings of the correlation detectors, by kind and hardware attribution.",
            ["kind", "hardware"],
            registry=r,
        )
        self.detector_cycle = Histogram(
            "watchd_detector_cycle_seconds",
            "Time one cycle of the detectors computes over every running job (its slices summed: the event "
            "loop is served between them).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.detector_slice = Gauge(
            "watchd_detector_cycle_longest_slice_seconds",
            "The longest slice of the last detector cycle: the longest it held the event loop at once.",
            registry=r,
        )
        self.jobs_tracked = Gauge("watchd_jobs_tracked", "Running jobs the detectors watch.", registry=r)
        self.job_provider_up = Gauge(
            "watchd_job_provider_up",
            "1 when the job provider's last listing succeeded, by provider.",
            ["provider"],
            registry=r,
        )
