"""The agent's ``sources:`` section: the kernel log (kmsg, journald), followed files, the GPU backend
(:mod:`watchd.gpu.settings`), the InfiniBand/RoCE ports (:mod:`watchd.ib.settings`) and the training
stack's own output."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from watchd.gpu.settings import GpuSourceConfig
from watchd.ib.settings import IbConfig
from watchd.model.durations import Seconds
from watchd.strict import Strict


class KmsgConfig(Strict):
    enabled: bool = True
    path: Path = Path("/dev/kmsg")
    state_file: Path | None = Path("/var/lib/watchd/kmsg.state")


class FileSourceConfig(Strict):
    path: Path
    poll_interval_s: Seconds = 0.5
    # who may write the file decides what it says: any local user can put a kernel-looking line in
    # /var/log/syslog (logger -t kernel). "untrusted": its Xid lines are counted, never evidence;
    # "any-writer": you vouch that only the kernel's lines can reach it (docs/security.md)
    trust: Literal["untrusted", "any-writer"] = "untrusted"


class JournaldConfig(Strict):
    """The kernel's lines from the systemd journal (``_TRANSPORT=kernel`` only; docs/security.md)."""

    enabled: bool = False
    journalctl: str = "journalctl"
    directory: Path | None = None  # a journal folder (default: the system journal)
    cursor_file: Path | None = Path("/var/lib/watchd/journald.cursor")


# where the training stack's own output is read (docs/training-logs.md)
class TrainingLogsConfig(Strict):
    slurm_jobs: bool = False  # follow the StdOut/StdErr files of the Slurm jobs running on this node
    slurm_node: str | None = None  # this node's name in Slurm (default: the agent's node)
    slurm_conf: Path | None = None  # SLURM_CONF for squeue/scontrol (default: theirs)
    slurm_poll_s: Seconds = 15.0
    pods_dir: Path | None = None  # e.g. /var/log/pods: follow the containers' logs
    pods_poll_s: Seconds = 10.0
    journald_units: list[str] = Field(default_factory=list)
    journalctl: str = "journalctl"
    flight_recorder_dirs: list[Path] = Field(default_factory=list)
    flight_recorder_prefix: str = Field(default="nccl_trace_rank_", min_length=1, max_length=128)
    flight_recorder_poll_s: Seconds = 5.0
    max_files: Annotated[int, Field(ge=1, le=4096)] = 64
    max_events_per_minute: Annotated[int, Field(ge=1)] = 120  # per job and kind; more are dropped, counted


class SourcesConfig(Strict):
    kmsg: KmsgConfig = KmsgConfig()
    journald: JournaldConfig = JournaldConfig()
    files: list[FileSourceConfig] = Field(default_factory=list)
    gpu: GpuSourceConfig = GpuSourceConfig()
    ib: IbConfig = IbConfig()  # InfiniBand/RoCE ports from sysfs
    training: TrainingLogsConfig = TrainingLogsConfig()
