"""The engine's Prometheus metrics, in a registry of its own (several engines can share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from watchd.httputil import standard_metrics

#: the actions timed in the scheduler (``ActionRuntime.scheduled``): their histogram series exist from start
SCHEDULER_ACTIONS = ("drain", "requeue", "resume", "reboot", "gpu_reset")
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        standard_metrics(r, "engine")  # process_*, python_info, watchd_build_info; no *_created
        self.events_received = Counter(
            "watchd_events_received",
            "Events accepted by ingest, by source and kind.",
            ["source", "kind"],
            registry=r,
        )
        self.events_duplicate = Counter(
            "watchd_events_duplicate",
            "Events dropped at ingest because their id was seen before.",
            registry=r,
        )
        self.events_invalid = Counter(
            "watchd_events_invalid",
            "Events set aside at ingest for breaking the wire format (the rest of the batch is kept).",
            registry=r,
        )
        self.events_restamped = Counter(
            "watchd_events_restamped",
            "Events stamped > 5 min ahead of the engine's clock, kept with their arrival time.",
            ["source"],
            registry=r,
        )
        self.ingest_ack_timeouts = Counter(
            "watchd_ingest_ack_timeouts_total",
            "Ingest replies sent before their batch was evaluated (ingest.ack_timeout_s passed: a backlog).",
            registry=r,
        )
        self.ingest_rejected = Counter(
            "watchd_ingest_rejected",
            "Ingest requests refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.rule_groups_evicted = Counter(
            "watchd_rule_groups_evicted",
            "Rule groups forgotten (least recently inserted first) to keep a rule's tables within their "
            "bounds by count and by bytes of keys.",
            registry=r,
        )
        self.rule_matches = Counter(
            "watchd_rule_matches",
            "Events matched, by rule.",
            ["rule"],
            registry=r,
        )
        self.actions = Counter(
            "watchd_actions",
            "Actions decided, by kind, mode and outcome.",
            ["action", "mode", "outcome"],
            registry=r,
        )
        self.drain_store_failures = Counter(
            "watchd_drain_store_failures",
            "Drains whose round met a failure of the state database (the safety breaker's window could not "
            "be read or written), by result: retried (the drain waits and goes into a later round) or "
            "interrupted (after 6 rounds: its intent stays open and it is driven again once the store "
            "answers). Nothing is lost either way.",
            ["result"],
            registry=r,
        )
        for result in ("retried", "interrupted"):
            self.drain_store_failures.labels(result)
        self.decision_latency = Histogram(
            "watchd_decision_latency_seconds",
            "From an event's arrival at ingest until its actions are done (or logged in dry-run).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.action_duration = Histogram(
            "watchd_action_duration_seconds",
            "Time spent in the scheduler for one action, by kind.",
            ["action"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # every action that calls the scheduler, at 0 from the start: a series born at its first observation
        # has no rate() in Prometheus until the second
        for action in SCHEDULER_ACTIONS:
            self.action_duration.labels(action)
        self.event_age = Histogram(
            "watchd_event_age_seconds",
            "From an event's observation on the node until its arrival at ingest.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "watchd_engine_queue_depth",
            "Events accepted but not yet evaluated.",
            registry=r,
        )
        self.rules_loaded = Gauge("watchd_rules_loaded", "Rules in the active rule set.", registry=r)
        self.rules_reload_ok = Gauge(
            "watchd_rules_last_reload_successful",
            "1 when the last rule (re)load succeeded, else 0.",
            registry=r,
        )
        self.rules_reload_failures = Counter(
            "watchd_rules_reload_failures_total",
            "Rule reloads refused (as `watchd rules check` refuses the files): the old rules stayed.",
            registry=r,
        )
        self.rules_reload_time = Gauge(
            "watchd_rules_last_reload_success_timestamp_seconds",
            "When the rules were last (re)loaded.",
            registry=r,
        )
        self.mode_enforce = Gauge(
            "watchd_engine_enforce",
            "1 when the engine acts (enforce), 0 in dry-run.",
            registry=r,
        )
        self.leader = Gauge(
            "watchd_leader",
            "1 while this engine may act (it holds the leader lease, or runs without election); 0 following.",
            registry=r,
        )
        self.scheduler_privileged = Gauge(
            "watchd_scheduler_privileged",
            "1 when the scheduler lets this engine drain, resume, requeue and reserve (asked at start, "
            "changing nothing); 0 when it refuses: every such action would fail; NaN: it could not tell.",
            registry=r,
        )
        self.store_errors = Counter(
            "watchd_store_errors",
            "Failures of the state database (disk full, read-only, locked past the busy timeout, text it "
            "cannot store), by operation: write (a decision, an audit record, a probe) or read.",
            ["operation"],
            registry=r,
        )
        self.store_writable = Gauge(
            "watchd_store_writable",
            "1 while the state database takes writes (the last write or probe succeeded), 0 while decisions "
            "cannot be recorded: ingest answers 503 and /readyz is not ready. Alert on it.",
            registry=r,
        )
        self.store_writable.set(1)
        for operation in ("write", "read"):
            self.store_errors.labels(operation)
