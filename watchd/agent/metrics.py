"""The agent's Prometheus metrics, in a registry of its own (the simulator runs many agents per process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from watchd.httputil import standard_metrics
from watchd.ib.metrics import IbPortCollector


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        standard_metrics(r, "agent")  # process_*, python_info, watchd_build_info; no *_created
        self.lines = Counter("watchd_agent_log_lines", "Log lines read, by source.", ["source"], registry=r)
        self.events = Counter(
            "watchd_agent_events",
            "Events produced, by source and kind.",
            ["source", "kind"],
            registry=r,
        )
        self.shipped = Counter("watchd_agent_events_shipped", "Events delivered to the engine.", registry=r)
        self.dropped = Counter(
            "watchd_agent_events_dropped",
            "Events that could not be delivered, by reason (queue_full, rejected, invalid, shutdown).",
            ["reason"],
            registry=r,
        )
        for reason in ("queue_full", "rejected", "invalid", "shutdown", "trainlog_rate"):  # 0 from the start
            self.dropped.labels(reason)
        self.requests = Counter(
            "watchd_agent_ship_requests",
            "Requests to the engine, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.queue_depth = Gauge("watchd_agent_queue_depth", "Events waiting to be shipped.", registry=r)
        self.kmsg_lost = Counter(
            "watchd_agent_kmsg_records_lost",
            "Kernel log records overwritten before they were read.",
            registry=r,
        )
        self.source_up = Gauge(
            "watchd_source_up",
            "1 while a source is being read, 0 when it failed.",
            ["source"],
            registry=r,
        )
        self.source_errors = Counter(
            "watchd_agent_source_errors",
            "Failures of a source (it is restarted).",
            ["source"],
            registry=r,
        )
        self.engine_up = Gauge(
            "watchd_agent_engine_reachable",
            "1 when the last request to the engine succeeded.",
            registry=r,
        )
        self.heartbeats = Counter(
            "watchd_agent_heartbeats",
            "Heartbeat reports from training ranks, by outcome (accepted, invalid, refused_capacity).",
            ["outcome"],
            registry=r,
        )
        self.xid_untrusted = Counter(
            "watchd_agent_xid_untrusted",
            "Xid lines refused as evidence: not written by the kernel, or from a file not trusted "
            "(docs/security.md), by source.",
            ["source"],
            registry=r,
        )
        self.files_refused = Counter(
            "watchd_agent_files_refused",
            "Users' files not read (a job's output, a pod's log, a dump), by source and reason (symlink, "
            "not_regular, owner, too_large, unreadable; a dump's content: malformed, code, limits: "
            "docs/security.md).",
            ["source", "reason"],
            registry=r,
        )
        self.bytes_skipped = Counter(
            "watchd_agent_log_bytes_skipped",
            "Bytes of followed files skipped unread: written faster than the source's read budget.",
            ["source"],
            registry=r,
        )
        self.heartbeats_rejected = Counter(
            "watchd_agent_heartbeats_rejected",
            "Heartbeat reports refused as evidence: not from the job they name, by reason "
            "(docs/security.md).",
            ["reason"],
            registry=r,
        )
        self.heartbeat_endpoint_up = Gauge(
            "watchd_agent_heartbeat_endpoint_up",
            "1 while the heartbeat endpoint listens, 0 when it could not be opened (the agent runs on).",
            ["endpoint"],
            registry=r,
        )
        self.heartbeat_ranks = Gauge(
            "watchd_agent_heartbeat_ranks", "Training ranks whose heartbeats the agent tracks.", registry=r
        )
        # InfiniBand/RoCE ports (sources.ib): the per-port series come from the last scan
        self.ib_ports = IbPortCollector()
        r.register(self.ib_ports)
        self.ib_scans = Counter(
            "watchd_agent_ib_scans",
            "Scans of the InfiniBand/RoCE ports, by outcome (ok; absent: no /sys/class/infiniband).",
            ["outcome"],
            registry=r,
        )
        self.ib_scan_cpu = Counter(
            "watchd_agent_ib_scan_cpu_seconds",
            "CPU time the scans of the InfiniBand/RoCE ports took (the reading thread's).",
            registry=r,
        )
        self.ib_unreadable = Counter(
            "watchd_agent_ib_files_unreadable",
            "Port files that exist but could not be read (EIO, EACCES, a driver error), each time.",
            registry=r,
        )

        # the engine's commands (a GPU reset; docs/remediation.md)
        self.commands = Counter(
            "watchd_agent_commands_run",
            "Commands the engine asked of this agent, by command and how each ended (done, refused, failed).",
            ["command", "outcome"],
            registry=r,
        )
        self.command_polls = Counter(
            "watchd_agent_command_polls",
            "Polls for the node's commands, by result (ok, unreachable, refused, unsupported, invalid).",
            ["result"],
            registry=r,
        )
        self.command_memory_errors = Counter(
            "watchd_agent_command_memory_errors",
            "commands.state_file failures, by operation: write (a record not on disk: a command about to run "
            "is refused), read (the file unreadable at start, set aside).",
            ["operation"],
            registry=r,
        )
        self.command_seconds = Histogram(
            "watchd_agent_command_duration_seconds",
            "How long a command took to run on the node (a GPU reset: seconds).",
            ["command"],
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
            registry=r,
        )

    def ib_scanned(self, outcome: str, cpu_s: float) -> None:
        self.ib_scans.labels(outcome).inc()
        self.ib_scan_cpu.inc(cpu_s)
