"""Read the Flight Recorder dumps jobs on this node write and ship one event per rank and process
group: the last collective sequence enqueued, started and completed.

Watches folders (``sources.training.flight_recorder_dirs``: where the jobs'
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` or ``TORCH_FR_DUMP_TEMP_FILE`` prefix points), and their subfolders one
level down, for files named ``<prefix><rank>``. A file is read once its size held still for one poll, and
again only when it changes.

The files are the users': each is opened through :mod:`watchd.untrusted` (a symlink, FIFO, device or socket
is refused unopened), read to at most :data:`~watchd.trainlog.flight_recorder.MAX_DUMP_BYTES` whatever its
size said, and parsed by :mod:`watchd.trainlog.flight_recorder` (no job's code runs, bounded memory and
time); polls run in :data:`~watchd.untrusted.FILE_IO`, never in the event loop's default threads. A file not
read is counted by reason in :attr:`FlightRecorderSource.refused` (and told to ``on_refused``): the file's
(``symlink``, ``not_regular``, ``too_large``, ``unreadable``) or its content's (``malformed``, ``code``: a
pickle that would run code or build objects, ``limits``). Listing is bounded too: at most
:data:`_MAX_FOLDERS` subfolders (job ids first) and :data:`_MAX_LISTED` names a folder.

The job: a dump in a folder named by a Slurm job id (``.../<jobid>/nccl_trace_rank_3``) is that job's only
when the job is known to run as the file's owner (:class:`~watchd.sources.job_owners.JobOwners`), the folder
is that user's (or root's) and the file has a single link; otherwise, and without ``job_owners``, it is
attributed to no job (counted in :attr:`FlightRecorderSource.unattributed`): anyone can name a folder after
another user's job.

Unlike the line sources it yields events (:class:`EventSource`); the agent ships them as it ships the rest.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Protocol

from watchd.clock import Clock, SystemClock
from watchd.logs import get_logger
from watchd.model.events import Event, stable_id
from watchd.sources.job_owners import JobOwners
from watchd.trainlog.flight_recorder import MAX_DUMP_BYTES, DumpError, load_dump, summarize
from watchd.untrusted import FILE_IO, Refused, open_untrusted, read_bounded

__all__ = ["EventSource", "FlightRecorderSource"]

_log = get_logger("watchd.source.flight_recorder")
_MAX_FILES = 4096  # dumps looked at a poll
_MAX_FOLDERS = 256  # subfolders looked into, a configured folder
_MAX_LISTED = 16_384  # names listed, a folder
_JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9})?")  # a job's id, or an array task's label


class EventSource(Protocol):
    name: str

    def events(self) -> AsyncIterator[Event]:
        """Events as they are found, forever; cancellation stops it."""
        ...


def _listing(folder: Path) -> tuple[list[str], list[str]]:
    """The names in ``folder`` (at most :data:`_MAX_LISTED`): of subfolders (not links to one), and of the
    rest."""
    files: list[str] = []
    folders: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for i, entry in enumerate(entries):
                if i >= _MAX_LISTED:
                    break
                try:
                    (folders if entry.is_dir(follow_symlinks=False) else files).append(entry.name)
                except OSError:
                    continue
    except OSError:
        pass
    return files, folders


def _read(path: Path) -> tuple[bytes, os.stat_result]:
    """The file's content, at most :data:`MAX_DUMP_BYTES`, and its status (:class:`Refused` otherwise)."""
    fd = open_untrusted(path)
    try:
        st = os.fstat(fd)
        return read_bounded(fd, MAX_DUMP_BYTES, path), st
    except OSError as exc:
        raise Refused(path, "unreadable", exc.strerror or str(exc)) from None
    finally:
        os.close(fd)


class FlightRecorderSource:
    def __init__(
        self,
        node: str,
        dirs: Sequence[Path],
        *,
        prefix: str = "nccl_trace_rank_",
        poll_interval_s: float = 5.0,
        clock: Clock | None = None,
        job_owners: JobOwners | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        """``job_owners``: whose each Slurm job is (None: no dump is attributed to a job). ``on_refused``
        hears why a file was not read, once per version of the file."""
        self.name = "flight-recorder"
        self.node = node
        self.dirs = tuple(dirs)
        self.prefix = prefix
        self.poll_interval_s = poll_interval_s
        self._clock = clock or SystemClock()
        self._pattern = re.compile(re.escape(prefix) + r"([0-9]{1,9})$")
        self._seen: dict[Path, tuple[int, int]] = {}  # path -> (size, mtime_ns) read
        self._pending: dict[Path, tuple[int, int]] = {}  # path -> (size, mtime_ns) at the last poll
        self.job_owners = job_owners
        self._on_refused = on_refused or (lambda reason: None)
        self.unreadable = 0  # files not read: unreadable, or not a dump this reader reads
        self.too_large = 0
        self.read = 0
        self.unattributed = 0  # dumps in a job's folder, not taken as that job's
        self.refused: Counter[str] = Counter()  # files not read, by reason

    def _candidates(self) -> list[tuple[Path, int]]:
        out: list[tuple[Path, int]] = []
        for root in self.dirs:
            files, folders = _listing(root)
            # the job folders first: a user's own folders cannot crowd the jobs' out of the bound
            folders.sort(key=lambda name: _JOB_ID.fullmatch(name) is None)
            todo = [(root, files)] + [(root / name, None) for name in folders[:_MAX_FOLDERS]]
            for folder, names in todo:
                for name in names if names is not None else _listing(folder)[0]:
                    m = self._pattern.search(name)
                    if m is not None and len(out) < _MAX_FILES:
                        out.append((folder / name, int(m.group(1))))
        return out

    def _refuse(self, path: Path, reason: str, detail: str) -> None:
        self.refused[reason] += 1
        self._on_refused(reason)
        if reason == "too_large":
            self.too_large += 1
        else:
            self.unreadable += 1
        _log.warning("flight_recorder_dump_refused", path=str(path), reason=reason, error=detail[:200])

    def _job(self, path: Path, st: os.stat_result) -> str | None:
        """The Slurm job the dump is taken as: the one its folder names, when that job is its owner's."""
        ident = path.parent.name
        if _JOB_ID.fullmatch(ident) is None:
            return None
        owner = self.job_owners.owner(ident) if self.job_owners is not None else None
        uid = owner.uid if owner is not None else None
        try:
            folder_uid = os.stat(path.parent, follow_symlinks=False).st_uid
        except OSError:
            folder_uid = -1
        if owner is not None and st.st_uid == uid and folder_uid in (uid, 0) and st.st_nlink == 1:
            return owner.job
        self.unattributed += 1
        _log.info(
            "flight_recorder_job_unverified",
            path=str(path),
            job=ident,
            job_uid=uid,
            file_uid=st.st_uid,
            folder_uid=folder_uid,
        )
        return None

    def scan(self) -> list[Event]:
        """One poll (blocking: run in a thread): the events of the dumps new or changed, and stable."""
        events: list[Event] = []
        present = set()
        for path, rank in self._candidates():
            present.add(path)
            try:
                st = os.stat(path, follow_symlinks=False)  # a link's own; never what it points to
            except OSError:
                continue
            sig = (st.st_size, st.st_mtime_ns)
            if self._seen.get(path) == sig:
                continue
            if self._pending.get(path) != sig:
                self._pending[path] = sig  # changed since the last poll: wait until it holds still
                continue
            self._pending.pop(path, None)
            self._seen[path] = sig
            if st.st_size > MAX_DUMP_BYTES:  # as its size says; the read stops at the bound whatever it says
                self._refuse(path, "too_large", f"{st.st_size} bytes")
                continue
            try:
                data, st = _read(path)
                dump = load_dump(data)
            except Refused as exc:
                if exc.reason != "missing":
                    self._refuse(path, exc.reason, exc.detail)
                continue
            except DumpError as exc:
                self._refuse(path, exc.reason, str(exc))
                continue
            job = self._job(path, st)
            records, left_out = summarize(dump, rank=rank, job=job, path=str(path))
            if left_out:
                _log.warning("flight_recorder_groups_left_out", path=str(path), count=left_out)
            self.read += 1
            when = st.st_mtime_ns / 1e9
            for rec in records:
                events.append(
                    rec.to_event(
                        id=stable_id(self.node, "flight_recorder", path, sig, rec.pg),
                        node=self.node,
                        source=self.name,
                        time=when,
                    )
                )
        for gone in [p for p in self._seen if p not in present]:
            del self._seen[gone]
        for gone in [p for p in self._pending if p not in present]:
            del self._pending[gone]
        return events

    async def events(self) -> AsyncIterator[Event]:
        while True:
            for event in await asyncio.get_running_loop().run_in_executor(FILE_IO, self.scan):
                yield event
            await asyncio.sleep(self.poll_interval_s)
