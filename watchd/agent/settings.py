"""The agent's own config sections: the engine it ships to (``engine:``), the shipper's batching and
back-off (``shipper:``), the local heartbeat endpoint (``heartbeat:``; docs/heartbeats.md), and what the
engine may ask of it (``commands:``; docs/remediation.md). Pydantic
and watchd's vocabulary only: aiohttp is not imported to load a config."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from watchd.credentials import TokenSource
from watchd.gpu.settings import GpuResetConfig
from watchd.http_settings import HttpConfig, Listen, Port
from watchd.logs import LogConfig
from watchd.model.durations import Seconds
from watchd.sources.settings import SourcesConfig
from watchd.strict import Strict


class EngineEndpoint(Strict):
    url: Annotated[str, Field(pattern=r"^https?://[^\s/]+")] = "http://127.0.0.1:9120"
    auth: TokenSource = TokenSource()
    timeout_s: Seconds = 5.0
    ca_file: Path | None = None  # https: trust this CA (default: the system's)
    client_cert: Path | None = None  # mutual TLS: the agent's certificate ...
    client_key: Path | None = None  # ... and its key

    @model_validator(mode="after")
    def _tls(self) -> EngineEndpoint:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("engine: give client_cert and client_key together")
        tls = self.ca_file is not None or self.client_cert is not None
        if tls and not self.url.startswith("https://"):
            raise ValueError("engine: ca_file/client_cert need an https:// url")
        return self


class ShipperConfig(Strict):
    max_batch: Annotated[int, Field(ge=1)] = 1000
    queue_size: Annotated[int, Field(ge=1)] = 100_000
    backoff_initial_s: Seconds = 0.2
    backoff_max_s: Seconds = 30.0
    shutdown_flush_s: Annotated[float, Field(ge=0)] = 5.0
    # what is still queued after shutdown_flush_s is kept here and delivered after the next start (at most
    # queue_size events); null: it is lost, counted as reason="shutdown"
    spool_file: Path | None = Path("/var/lib/watchd-agent/spool.jsonl")


class HeartbeatConfig(Strict):
    """The local endpoint where training ranks report their progress (docs/heartbeats.md). On by default: it
    costs nothing until a rank reports, and an endpoint that cannot be opened is logged and counted, never
    fatal."""

    enabled: bool = True
    socket: Path | None = Path("/run/watchd/heartbeat.sock")  # None: no Unix socket
    # who may connect. Default (null): "0666" with verify (every local user may connect: each report counts
    # only from the job it names, checked by the peer's cgroup), "0660" without it
    socket_mode: Annotated[str, Field(pattern=r"^0?[0-7]{3}$")] | None = None
    # the socket's group, by name or gid (null: the agent's own); with socket_mode "0660", who may report
    socket_group: (
        Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$")] | Annotated[int, Field(ge=0)] | None
    ) = None
    # on 127.0.0.1 only; 0: off. With verify, each job needs its token (token_secret; docs/security.md)
    http_port: Port = 0
    # reports count only from the job they name (the socket peer's cgroup, or the job's token over TCP);
    # false: any local process may report for any job (not for production)
    verify: bool = True
    token_secret: TokenSource = TokenSource()  # the node secret the per-job TCP tokens derive from
    identity: Literal["proc", "fake"] = "proc"  # who a socket peer is: /proc/<pid>/cgroup (fake: tests)
    proc_root: Path = Path("/proc")
    max_ranks_per_job: Annotated[int, Field(ge=1)] = 512  # per verified job or pod
    forward_interval_s: Seconds = 2.0
    max_ranks: Annotated[int, Field(ge=1)] = 1024
    forget_after_s: Seconds = 600.0
    http: HttpConfig = HttpConfig(max_connections=256)  # both endpoints (socket and 127.0.0.1)

    @property
    def socket_permissions(self) -> int:
        """The socket's mode bits: ``socket_mode``, or the default for ``verify``."""
        if self.socket_mode is not None:
            return int(self.socket_mode, 8)
        return 0o666 if self.verify else 0o660

    @model_validator(mode="after")
    def _tcp_needs_tokens(self) -> HeartbeatConfig:
        secret = self.token_secret
        given = secret.token_file or secret.token_env or secret.token
        if self.verify and self.http_port and not given:
            raise ValueError(
                "heartbeat.http_port with verify needs heartbeat.token_secret (per-job tokens, "
                "docs/security.md); or use the Unix socket (http_port: 0)"
            )
        return self


class CommandsConfig(Strict):
    """What the engine may ask the agent to do on its node (a GPU reset; docs/remediation.md): the agent
    asks for its node's commands every ``poll_s``, runs each at most once (never before ``state_file``
    durably says it runs it, so a restart does not run one again) and reports the result."""

    enabled: bool = True
    poll_s: Seconds = 10.0
    # the ids handled and their results (the last 30 days), in a folder only root or the agent may write;
    # null: nothing can be recorded, so every command is refused (docs/remediation.md)
    state_file: Path | None = Path("/var/lib/watchd-agent/commands.json")
    gpu_reset: GpuResetConfig = GpuResetConfig()


class AgentConfig(Strict):
    # NODE_NAME: the Kubernetes node name from the downward API (the DaemonSet sets it)
    node: str = Field(
        default_factory=lambda: os.environ.get("NODE_NAME") or socket.gethostname().split(".")[0]
    )
    engine: EngineEndpoint = EngineEndpoint()
    listen: Listen = Listen(port=9121)
    sources: SourcesConfig = SourcesConfig()
    heartbeat: HeartbeatConfig = HeartbeatConfig()
    shipper: ShipperConfig = ShipperConfig()
    commands: CommandsConfig = CommandsConfig()
    log: LogConfig = LogConfig()
