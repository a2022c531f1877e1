"""Where the check jobs write their outputs (``checks.output_dir``): a folder only the engine's user can
write, for whoever can put a file there decides the checks' verdicts. Checked at the engine's start and by
``watchd engine --check``, as OpenSSH checks the paths it trusts (``secure_path``):

- the folder itself: a directory, not a symbolic link, owned by the engine's user, not writable by its
  group or by others (the check jobs run as the engine's user: Slurm creates their outputs as it);
- every directory a lookup of its path passes through (links followed as the kernel follows them): owned
  by root or the engine's user, not writable by its group or others unless sticky and root's (``/tmp``):
  otherwise whoever can write there can rename the folder away and put their own in its place.

A missing folder is created (mode 0750) when the directories above it pass. Anything else is a
:class:`ConfigError` naming the key, what is wrong and the command that fixes it."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from watchd.errors import ConfigError

__all__ = ["KEY", "MODE", "check_output_dir", "engine_uid"]

KEY = "checks.output_dir"
MODE = 0o750


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def engine_uid(user: str) -> int:
    """The engine's user as ``watchd engine --check`` sees it: itself, or, run as root (outside the unit),
    the user the config names as the engine's (``checks.slurm.user``)."""
    if os.geteuid() != 0:
        return os.geteuid()
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ConfigError(f"checks.slurm.user: no user {user!r} on this host") from None


def _writers(mode: int) -> str:
    return "others" if mode & 0o002 else "its group"


def _fix(path: Path, uid: int) -> str:
    return f"install -d -m 0750 -o {_user(uid)} {path}"


def _looked_up(path: Path) -> list[str]:
    """Every directory the kernel looks a name up in to reach ``path`` (each prefix resolved, and the
    directories above each resolution), from the root down."""
    seen: dict[str, None] = {}
    prefixes = [*reversed(path.parents), path]
    for prefix in prefixes:
        real = Path(os.path.realpath(prefix))
        for d in (*reversed(real.parents), real):
            seen.setdefault(str(d))
    return list(seen)


def _check_above(path: Path, uid: int) -> None:
    for d in _looked_up(path.parent):
        try:
            st = os.stat(d)
        except OSError as exc:
            raise ConfigError(
                f"{KEY}: {d} (above {path}): {exc.strerror or exc}; create the folder with {_fix(path, uid)}"
            ) from None
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (0, uid):
            raise ConfigError(
                f"{KEY}: {d} (above {path}) is owned by {_user(st.st_uid)} (uid {st.st_uid}), who can "
                f"replace the folder: only root or the engine's user ({_user(uid)}) may own the directories "
                f"above it; choose another folder, e.g. {_fix(Path('/var/lib/watchd/checks'), uid)}"
            )
        if mode & 0o022 and not (mode & stat.S_ISVTX and st.st_uid == 0):
            raise ConfigError(
                f"{KEY}: {d} (above {path}) is writable by {_writers(mode)} (mode {mode:04o}) and not "
                f"sticky: anyone who can write there can replace the folder; chmod go-w {d}, or choose "
                f"another folder, e.g. {_fix(Path('/var/lib/watchd/checks'), uid)}"
            )


def _check_folder(path: Path, st: os.stat_result, uid: int) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{KEY}: {path} is a symbolic link (to {os.readlink(path)}): name the folder itself, "
            f"owned by the engine's user ({_fix(path, uid)} after removing the link)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{KEY}: {path} is not a folder; create it with {_fix(path, uid)}")
    if st.st_uid != uid:
        raise ConfigError(
            f"{KEY}: {path} is owned by {_user(st.st_uid)} (uid {st.st_uid}), not by the engine's user "
            f"{_user(uid)} (uid {uid}), who runs the check jobs and alone may write there; {_fix(path, uid)}"
        )
    if mode & 0o022:
        raise ConfigError(
            f"{KEY}: {path} is writable by {_writers(mode)} (mode {mode:04o}): whoever can write there "
            f"decides the checks' verdicts; make it the engine's user's alone: {_fix(path, uid)}"
        )


def check_output_dir(path: Path, *, create: bool = True, uid: int | None = None) -> str:
    """What the folder is (``ok``, ``created``, or ``missing...``: not created with ``create`` False);
    :class:`ConfigError` when it or a directory above it is not safe."""
    uid = os.geteuid() if uid is None else uid
    if not path.is_absolute():
        raise ConfigError(f"{KEY}: {path} is not an absolute path")
    _check_above(path, uid)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return "missing: the engine creates it at start (mode 0750)"
        try:
            os.mkdir(path, MODE)
            os.chmod(path, MODE)  # whatever the umask took away
        except OSError as exc:
            raise ConfigError(
                f"{KEY}: cannot create {path}: {exc.strerror or exc}; {_fix(path, uid)}"
            ) from None
        _check_folder(path, os.lstat(path), uid)
        return "created"
    except OSError as exc:
        raise ConfigError(f"{KEY}: {path}: {exc.strerror or exc}") from None
    _check_folder(path, st, uid)
    return "ok"
