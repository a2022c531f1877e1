"""The agent's ``sources.ib`` section: where and how often the InfiniBand/RoCE ports are read, and what counts
as a port down, downtrained or erroring (docs/configuration.md). Pydantic and watchd's vocabulary only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from watchd.model.durations import Seconds
from watchd.model.ib import COUNTER_WIDTHS, DEFAULT_ERROR_THRESHOLDS
from watchd.strict import Strict

_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
#: mlx5 transport counters worth a Prometheus series (retries and timeouts NCCL's completion errors follow);
#: metrics only unless named in ``error_thresholds``
DEFAULT_HW_COUNTERS = (
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "out_of_sequence",
    "req_transport_retries_exceeded",
)


class IbConfig(Strict):
    enabled: bool = True
    root: Path = Path("/sys/class/infiniband")
    # half the hang detector's 30 s floor: a link lost at a hang's onset is known before the culprit is named
    interval_s: Annotated[float, Field(ge=1.0, le=3600.0)] = 15.0
    devices: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=lambda: ["*"])
    max_devices: Annotated[int, Field(ge=1, le=1024)] = 32
    max_ports: Annotated[int, Field(ge=1, le=4096)] = 64
    # "device:port" patterns (fnmatch) that must be ACTIVE from the start; others only once seen ACTIVE
    expected_ports: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(default_factory=list)
    # "device:port" pattern -> the rate (Gb/s) its ports must run at, e.g. {"mlx5_*:1": 400}
    expected_rate_gbps: dict[
        Annotated[str, Field(min_length=1, max_length=128)], Annotated[float, Field(gt=0)]
    ] = Field(default_factory=dict)
    compare_peers: bool = True  # the fastest port of the same HCA type and link layer is a reference too
    downtrain_scans: Annotated[int, Field(ge=1, le=100)] = 2
    error_window_s: Annotated[float, Field(ge=10.0, le=86400.0)] = 300.0
    # counter -> rise within the window; merged over the defaults, 0 turns a counter off
    error_thresholds: dict[Annotated[str, Field(pattern=_NAME)], Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: dict(DEFAULT_ERROR_THRESHOLDS)
    )
    hw_counters: list[Annotated[str, Field(pattern=_NAME)]] = Field(
        default_factory=lambda: list(DEFAULT_HW_COUNTERS)
    )
    report_interval_s: Seconds = 60.0

    @field_validator("error_thresholds")
    @classmethod
    def _over_the_defaults(cls, value: dict[str, int]) -> dict[str, int]:
        return {k: v for k, v in {**DEFAULT_ERROR_THRESHOLDS, **value}.items() if v > 0}

    def hw_counters_read(self) -> tuple[str, ...]:
        """The ``hw_counters/`` files read: those named, and any a threshold names that is not one of the
        ``counters/`` (PortCounters) files."""
        extra = [c for c in self.error_thresholds if c not in COUNTER_WIDTHS and c not in self.hw_counters]
        return (*self.hw_counters, *extra)
