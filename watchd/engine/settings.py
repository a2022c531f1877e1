"""The engine shell's own config sections: the ingest API's limits and the rules folder's reload."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from watchd.model.durations import Seconds
from watchd.strict import Strict


class IngestConfig(Strict):
    max_body_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    max_events_per_batch: Annotated[int, Field(ge=1)] = 10_000
    dedup_window_s: Seconds = 3600.0
    dedup_max_ids: Annotated[int, Field(ge=1000)] = 1_000_000
    queue_size: Annotated[int, Field(ge=1)] = 100_000
    ack_timeout_s: Seconds = 5.0  # a reply waits at most this long for its batch to be evaluated


class ReloadConfig(Strict):
    watch_files: bool = True
    poll_interval_s: Seconds = 2.0
