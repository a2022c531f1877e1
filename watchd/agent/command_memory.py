"""What the agent remembers of the engine's commands (``commands.state_file``), so that it runs a command id
at most once across its own restarts: the ids it handled and how each ended (``running`` while one runs), and
the agent instances (one random id per agent process) whose every run is recorded here.

No run without a durable record: :meth:`CommandMemory.record` returns only once the record is on disk
(written to a new temporary file opened ``O_CREAT|O_EXCL|O_NOFOLLOW`` mode 0600, fsynced, renamed over the
file, the folder fsynced), and raises :class:`Unrecorded` otherwise; the runner then refuses the command.

Kept: every id handled in the last :data:`KEEP_S` (30 days; a command is handed out only while its action
waits, minutes), at most :data:`MAX_REMEMBERED`; when that many are younger, a new command is refused rather
than an id forgotten. A file that cannot be read (corrupt, empty, not a regular file of this user or root) is
set aside (``<file>.unreadable``) and nothing before this start is known: the engine's binding (the instance
each command was first handed to) then tells this agent which commands an earlier run of it may have run.

The file is written by root: its folder must belong to root or to the agent's user and be writable by no one
else (:func:`check_folder`, at start)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchd.errors import ConfigError
from watchd.logs import get_logger

__all__ = ["KEEP_S", "MAX_REMEMBERED", "RUNNING", "CommandMemory", "Unrecorded", "check_folder"]

_log = get_logger("watchd.agent.command_memory")

RUNNING = "running"
#: how long a handled id is kept (a node gets a few commands a week; one is handed out for minutes)
KEEP_S = 30 * 86400.0
#: at most this many ids (each with its result, a few KiB at most)
MAX_REMEMBERED = 1024
#: at most this many agent instances whose runs are all recorded here
MAX_INSTANCES = 64
_MAX_FILE_BYTES = 64 * 1024 * 1024
_VERSION = 2


class Unrecorded(Exception):
    """A record that is not on disk (the file cannot be written, or the memory is full): nothing may run."""


class FolderUnusable(ConfigError):
    """The folder cannot be created or looked at (a read-only file system): the agent runs on, refusing every
    command, rather than stop shipping its node's faults."""


def check_folder(folder: Path, uid: int | None = None) -> None:
    """Refuse (ConfigError) a folder for ``commands.state_file`` that others could write: not owned by root
    or by the agent's user (``uid``), or writable by its group or by anyone. Created (0700) when missing;
    :class:`FolderUnusable` when that fails."""
    uid = os.geteuid() if uid is None else uid
    where = f"commands.state_file: the folder {folder}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.stat(folder)
    except OSError as exc:
        raise FolderUnusable(f"{where}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{where} is not a folder")
    if st.st_uid not in (0, uid):
        raise ConfigError(f"{where} belongs to uid {st.st_uid}, not to root or to the agent (uid {uid})")
    if st.st_mode & 0o022:
        raise ConfigError(
            f"{where} is writable by its group or by anyone (mode {stat.S_IMODE(st.st_mode):04o}): "
            "whoever can write it could replace the agent's memory of the commands it ran; chmod go-w it"
        )


class CommandMemory:
    """The commands this agent handled, by id, kept in ``path`` (None: nowhere, so nothing may run)."""

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._instances: list[str] = []
        #: why nothing from before this start is known ("" when the file was read, or there was none)
        self.lost = ""
        #: why nothing can be recorded (so nothing run) for as long as this process lives ("": it can)
        self.unusable = "" if path is not None else "no commands.state_file is set"
        if path is not None:
            try:
                check_folder(path.parent)
            except FolderUnusable as exc:
                self.unusable = self.lost = str(exc)
                _log.error("command_memory_unusable", error=str(exc), hint="every command is refused")
                return
            self._load(path)

    # ----------------------------------------------------------------------------------------------- reading

    def _load(self, path: Path) -> None:
        try:
            raw = self._read(path)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            self.lost = f"{path}: {exc}"
            aside = path.with_name(path.name + ".unreadable")
            try:
                os.replace(path, aside)
            except OSError:
                aside = path
            _log.error("command_memory_unreadable", path=str(path), error=str(exc), kept_as=str(aside))
            return
        for command_id, entry in raw["commands"].items():
            if isinstance(entry, dict):
                self._entries[str(command_id)] = entry
        self._instances = [str(i) for i in raw.get("instances", []) if isinstance(i, str)]

    def _read(self, path: Path) -> dict[str, Any]:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("not a regular file")
            if st.st_uid not in (0, os.geteuid()):
                raise ValueError(f"owned by uid {st.st_uid}, not by root or the agent")
            data = os.read(fd, _MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > _MAX_FILE_BYTES:
            raise ValueError(f"more than {_MAX_FILE_BYTES} bytes")
        if not data.strip():
            raise ValueError("empty")
        raw = json.loads(data)
        if not isinstance(raw, dict) or not isinstance(raw.get("commands"), dict):
            raise ValueError("commands: not an object")
        if not isinstance(raw.get("instances", []), list):
            raise ValueError("instances: not a list")
        return raw

    def get(self, command_id: str) -> dict[str, Any] | None:
        return self._entries.get(command_id)

    def knows(self, instance: str) -> bool:
        """Whether every command ``instance`` ran is recorded here (it is one of this memory's instances)."""
        return instance in self._instances

    def __len__(self) -> int:
        return len(self._entries)

    # ----------------------------------------------------------------------------------------------- writing

    def adopt(self, instance: str) -> None:
        """This process is ``instance``: recorded, so that a later run, reading this file, knows that a
        command bound to it and not found here was never run. Never raises (without the record, a later run
        refuses such commands, which is safe)."""
        self._instances = [*(i for i in self._instances if i != instance), instance][-MAX_INSTANCES:]
        with contextlib.suppress(Unrecorded):
            self._save()

    def record(self, command_id: str, entry: dict[str, Any]) -> None:
        """Keep ``entry`` for ``command_id``, durably: :class:`Unrecorded` when it is not on disk (kept in
        memory all the same: the agent still answers from it while it runs)."""
        now = self._clock()
        self._prune(now)
        if command_id not in self._entries and len(self._entries) >= MAX_REMEMBERED:
            raise Unrecorded(
                f"the agent's memory holds {len(self._entries)} commands of the last "
                f"{KEEP_S / 86400:.0f} days (at most {MAX_REMEMBERED})"
            )
        self._entries[command_id] = {**entry, "at": now}
        self._entries.move_to_end(command_id)
        self._save()

    def _prune(self, now: float) -> None:
        for command_id, entry in list(self._entries.items()):
            at = entry.get("at")
            if isinstance(at, int | float) and at < now - KEEP_S:
                del self._entries[command_id]

    def _save(self) -> None:
        if self.path is None or self.unusable:
            raise Unrecorded(self.unusable)
        data = json.dumps(
            {"version": _VERSION, "instances": self._instances, "commands": self._entries}
        ).encode()
        try:
            _write_durably(self.path, data)
        except OSError as exc:
            _log.error("command_memory_unwritable", path=str(self.path), error=str(exc))
            raise Unrecorded(f"{self.path}: {exc.strerror or exc}") from None


def _write_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a new temporary file (never a link followed, never another's file
    reused), fsynced, renamed over ``path``, the folder fsynced."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a crash's leftover (the folder is the agent's alone: check_folder)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(folder)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a file system that cannot fsync a folder
            raise
    finally:
        os.close(folder)
