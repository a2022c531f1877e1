"""The checks' Prometheus metrics, on the engine's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["CheckMetrics"]


class CheckMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = Counter(
            "watchd_check_runs",
            "Check runs finished, by check and outcome (passed, failed, timeout, error).",
            ["check", "outcome"],
            registry=registry,
        )
        self.passed_over = Counter(
            "watchd_check_nodes_passed_over",
            "Nodes a round left out, by check and why (backoff, unknown).",
            ["check", "why"],
            registry=registry,
        )
        self.last_success = Gauge(
            "watchd_check_last_success_timestamp_seconds",
            "When a check last passed on a node (Unix time).",
            ["check", "node"],
            registry=registry,
        )
        self.busbw = Gauge(
            "watchd_check_busbw_gbps",
            "The bus bandwidth nccl-tests last measured on a node (GB/s, at the largest size).",
            ["check", "node"],
            registry=registry,
        )
        self.awaiting_validation = Gauge(
            "watchd_check_nodes_awaiting_validation",
            "Nodes whose last check failed and that have not passed `watchd node validate` since.",
            registry=registry,
        )
        self.running = Gauge(
            "watchd_check_runs_in_flight", "Check jobs submitted and not finished.", registry=registry
        )
        self.rounds = Counter(
            "watchd_check_rounds", "Rounds finished, by check.", ["check"], registry=registry
        )
