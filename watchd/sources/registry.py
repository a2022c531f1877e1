"""The agent's log sources by name (node-problem-detector style: watchers behind one interface, registered
here): each entry builds the sources its part of the ``sources:`` config asks for, none when it asks for none.

    kmsg   /dev/kmsg (``sources.kmsg``, unless ``enabled: false``)
    files  one followed file per ``sources.files`` entry (untrusted unless ``trust: any-writer``)
    journald  the journal's kernel lines (``sources.journald``, when ``enabled``)
    fake   the kernel log a fake GPU writes its driver lines to (``sources.gpu.backend: fake``)
    slurm-jobs  the output files of the Slurm jobs on the node (``sources.training.slurm_jobs``)
    pods        the container logs under ``sources.training.pods_dir``
    journald-units  the journal of ``sources.training.journald_units``

and the sources of events (not lines), by name too:

    ib-ports  the InfiniBand/RoCE ports under ``sources.ib.root`` (unless ``enabled: false``)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from watchd.errors import ConfigError
from watchd.ib.collector import IbPortSource
from watchd.ib.metrics import IbPortCollector
from watchd.sources.base import FakeLogSource, LogSource
from watchd.sources.filefollow import FileFollowSource
from watchd.sources.flight_recorder import EventSource
from watchd.sources.journald import JournaldSource
from watchd.sources.journald_units import JournaldUnitsSource
from watchd.sources.kmsg import KmsgSource
from watchd.sources.pod_logs import PodLogSource
from watchd.sources.settings import SourcesConfig
from watchd.sources.slurm_jobs import JobOutputSource, SlurmJobOutputs


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What sources get from the agent besides their config."""

    on_kmsg_lost: Callable[[int], None] = lambda n: None  # records the ring overwrote before they were read
    fake_kernel_log: FakeLogSource = field(default_factory=lambda: FakeLogSource("kmsg"))
    node: str = ""  # the agent's node name (the Slurm job-output source asks for this node's jobs)
    #: a user's file not read (source name, reason: symlink, not_regular, owner, ...)
    on_file_refused: Callable[[str, str], None] = lambda source, reason: None
    #: bytes of a user's file skipped unread (source name, bytes): written faster than the budget allows
    on_bytes_skipped: Callable[[str, int], None] = lambda source, n: None
    #: the InfiniBand ports' metrics, each scan (outcome, CPU seconds) and each file not read
    ib_ports: IbPortCollector | None = None
    on_ib_scan: Callable[[str, float], None] = lambda outcome, seconds: None
    on_ib_unreadable: Callable[[], None] = lambda: None


SourceFactory = Callable[[SourcesConfig, SourceContext], list[LogSource]]


def _kmsg(config: SourcesConfig, context: SourceContext) -> list[LogSource]:
    kmsg = config.kmsg
    if not kmsg.enabled:
        return []
    return [KmsgSource(kmsg.path, kmsg.state_file, on_lost=context.on_kmsg_lost)]


def _files(config: SourcesConfig, context: SourceContext) -> list[LogSource]:
    return [
        FileFollowSource(
            f.path,
            f.poll_interval_s,
            trusted=f.trust == "any-writer",
            on_refused=partial(context.on_file_refused, f"file:{f.path}"),
            on_skipped=partial(context.on_bytes_skipped, f"file:{f.path}"),
        )
        for f in config.files
    ]


def _journald(config: SourcesConfig, context: SourceContext) -> list[LogSource]:
    j = config.journald
    return (
        [JournaldSource(j.journalctl, cursor_file=j.cursor_file, directory=j.directory)] if j.enabled else []
    )


def _fake(config: SourcesConfig, context: SourceContext) -> list[LogSource]:
    return [context.fake_kernel_log] if config.gpu.backend == "fake" else []


def _slurm_jobs(config: SourcesConfig, context: SourceContext) -> list[LogSource]:
    t = config.training
    if not t.slurm_jobs:
        return []
    env = {"SLURM_CONF": str(t.slurm_conf)} if t.slurm_conf is not None else None
    lister = SlurmJobOutputs(t.slurm_node or context.node, env=env)
    return [
        JobOutputSource(
            lister,
            poll_interval_s=t.slurm_poll_s,
            max_files=t.max_files,
            on_refused=partial(context.on_file_refused, "slurm-jobs"),
            on_skipped=partial(context.on_bytes_skipped, "slurm-jobs"),
        )
    ]


def _pods(config: SourcesConfig, context: SourceContext) -> list[LogSource]:
    t = config.training
    if t.pods_dir is None:
        return []
    name = f"pods:{t.pods_dir}"
    return [
        PodLogSource(
            t.pods_dir,
            poll_interval_s=t.pods_poll_s,
            max_files=t.max_files,
            on_refused=partial(context.on_file_refused, name),
            on_skipped=partial(context.on_bytes_skipped, name),
        )
    ]


def _journald_units(config: SourcesConfig, context: SourceContext) -> list[LogSource]:
    t = config.training
    return [JournaldUnitsSource(t.journald_units, command=(t.journalctl,))] if t.journald_units else []


SOURCES: dict[str, SourceFactory] = {
    "kmsg": _kmsg,
    "files": _files,
    "fake": _fake,
    "journald": _journald,
    "slurm-jobs": _slurm_jobs,
    "pods": _pods,
    "journald-units": _journald_units,
}


def sources_from_config(
    config: SourcesConfig, context: SourceContext, names: Iterable[str] = tuple(SOURCES)
) -> list[LogSource]:
    """The sources ``config`` asks for, of the sources registered under ``names`` (all by default)."""
    out: list[LogSource] = []
    for name in names:
        factory = SOURCES.get(name)
        if factory is None:
            known = ", ".join(sorted(SOURCES))
            raise ConfigError(f"sources: no source named {name!r} (known: {known})")
        out += factory(config, context)
    return out


EventSourceFactory = Callable[[SourcesConfig, SourceContext], list[EventSource]]


def _ib_ports(config: SourcesConfig, context: SourceContext) -> list[EventSource]:
    if not config.ib.enabled:
        return []
    return [
        IbPortSource(
            context.node,
            config.ib,
            collector=context.ib_ports,
            on_scan=context.on_ib_scan,
            on_unreadable=context.on_ib_unreadable,
        )
    ]


EVENT_SOURCES: dict[str, EventSourceFactory] = {"ib-ports": _ib_ports}


def event_sources_from_config(
    config: SourcesConfig, context: SourceContext, names: Iterable[str] = tuple(EVENT_SOURCES)
) -> list[EventSource]:
    """The event sources ``config`` asks for, of those registered under ``names`` (all by default)."""
    out: list[EventSource] = []
    for name in names:
        factory = EVENT_SOURCES.get(name)
        if factory is None:
            known = ", ".join(sorted(EVENT_SOURCES))
            raise ConfigError(f"sources: no event source named {name!r} (known: {known})")
        out += factory(config, context)
    return out
