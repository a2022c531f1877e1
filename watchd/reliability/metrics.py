"""The reliability accounting's Prometheus metrics, from the last cycle's report and advice."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from watchd.reliability.estimate import MtbfEstimate
from watchd.reliability.report import Advice, Report
from watchd.reliability.settings import ReliabilityConfig


class ReliabilityState(Protocol):
    """What the metrics read of the accounting (:class:`watchd.reliability.subsystem.Reliability`)."""

    config: ReliabilityConfig
    _advice: dict[str, Advice]

    @property
    def _report(self) -> Report | None: ...


def _estimate_samples(est: MtbfEstimate) -> Iterator[tuple[str, float | None]]:
    yield "exposure", est.exposure_s
    yield "failures", float(est.failures)
    yield "mtbf", est.mtbf
    yield "lower", est.lower
    yield "upper", est.upper


class ReliabilityCollector(Collector):
    """The metrics, from the last cycle's report and advice: per partition and GPU model (bounded by the
    fleet's partitions and models), the lemons by name (capped), the jobs by label (capped)."""

    def __init__(self, owner: ReliabilityState) -> None:
        self.owner = owner

    def collect(self) -> Iterable[Any]:
        report, cfg = self.owner._report, self.owner.config
        g = {
            "exposure": GaugeMetricFamily(
                "watchd_reliability_exposure_node_seconds",
                "Node-seconds in service in the accounting window, by scope (partition, gpu_model) and name.",
                labels=["scope", "name"],
            ),
            "failures": GaugeMetricFamily(
                "watchd_reliability_failures",
                "Failures (watchd drains on hardware evidence) in the accounting window, by scope and name.",
                labels=["scope", "name"],
            ),
            "mtbf": GaugeMetricFamily(
                "watchd_reliability_mtbf_seconds",
                "Node MTBF estimate (exposure / failures), by scope and name; absent without a failure.",
                labels=["scope", "name"],
            ),
            "lower": GaugeMetricFamily(
                "watchd_reliability_mtbf_lower_seconds",
                "Lower bound of the MTBF's confidence interval (exact chi-square), by scope and name.",
                labels=["scope", "name"],
            ),
            "upper": GaugeMetricFamily(
                "watchd_reliability_mtbf_upper_seconds",
                "Upper bound of the MTBF's confidence interval, by scope and name; absent without a failure.",
                labels=["scope", "name"],
            ),
        }
        lost = GaugeMetricFamily(
            "watchd_reliability_lost_gpu_seconds",
            "GPU-seconds of nodes out of service after failures in the accounting window (GPUs x time out).",
        )
        lemons = GaugeMetricFamily(
            "watchd_reliability_lemon_failures",
            "Failures of each lemon node within the lemon window (at most reliability.metrics_lemons nodes).",
            labels=["node"],
        )
        if report is not None:
            scopes = [("partition", report.partitions), ("gpu_model", report.models)]
            for scope, groups in scopes:
                for name, est in sorted(groups.items()):
                    for key, value in _estimate_samples(est):
                        if value is not None:
                            g[key].add_metric([scope, name], value)
            lost.add_metric([], report.gpu_hours_lost * 3600.0)
            for node, count in report.lemons[: cfg.metrics_lemons]:
                lemons.add_metric([node], float(count))
        yield from g.values()
        yield lost
        yield lemons
        advised = GaugeMetricFamily(
            "watchd_checkpoint_advised_interval_seconds",
            "Daly's checkpoint interval for each running job (at most reliability.metrics_jobs jobs).",
            labels=["job"],
        )
        current = GaugeMetricFamily(
            "watchd_checkpoint_current_interval_seconds",
            "Each running job's compute time between checkpoints (median; or since its last one).",
            labels=["job"],
        )
        waste_now = GaugeMetricFamily(
            "watchd_checkpoint_expected_waste_ratio",
            "Expected share of compute lost (Daly's model) at the job's current and at the advised interval.",
            labels=["job", "interval"],
        )
        for a in sorted(self.owner._advice.values(), key=lambda a: a.job)[: cfg.metrics_jobs]:
            advised.add_metric([a.job], a.daly_s)
            waste_now.add_metric([a.job, "advised"], a.waste_advised)
            if a.current_s is not None:
                current.add_metric([a.job], a.current_s)
            if a.waste_current is not None:
                waste_now.add_metric([a.job, "current"], a.waste_current)
        yield advised
        yield current
        yield waste_now
