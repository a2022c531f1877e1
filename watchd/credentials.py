"""Where the daemons' secrets come from (docs/security.md): the shared bearer token (:class:`TokenSource`),
a person's named token, the engine's credentials by role (``auth:``), and what a secret file may be. Secrets
come from the environment or a file, so the YAML itself can be world-readable."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, model_validator

from watchd.errors import ConfigError
from watchd.logs import get_logger
from watchd.strict import Strict


class TokenSource(Strict):
    """Where the shared bearer token comes from: exactly one of ``token_file``, ``token_env``, ``token``."""

    token_file: Path | None = None
    token_env: str | None = None
    token: str | None = Field(default=None, repr=False)

    @model_validator(mode="after")
    def _exactly_one(self) -> TokenSource:
        given = [n for n in ("token_file", "token_env", "token") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give only one of token_file, token_env, token (got {', '.join(given)})")
        return self

    def resolve(self, key: str = "auth") -> str | None:
        """The token, or None when authentication is switched off (no source given). ``key``: where this
        source is in the config (``auth``, ``engine.auth``, ``auth.operators[0] (alice)``), for errors."""
        if self.token is not None:
            value = self.token
        elif self.token_env is not None:
            if self.token_env not in os.environ:
                raise ConfigError(f"{key}.token_env: environment variable {self.token_env} is not set")
            value = os.environ[self.token_env]
        elif self.token_file is not None:
            value = read_secret_file(self.token_file, f"{key}.token_file")
        else:
            return None
        value = value.strip()
        if not value:
            raise ConfigError(f"{key}: the token is empty")
        return value


def read_secret_file(configured: Path, key: str) -> str:
    """The text of the secret file ``configured`` (systemd's copy where the unit has one), once
    :func:`check_secret_file` accepted it; a ConfigError naming ``key`` and the file otherwise."""
    path = systemd_credential(configured)
    where = key if path == configured else f"{key} (systemd's credential for {configured})"
    try:
        check_secret_file(path, where)
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from exc


def systemd_credential(path: Path) -> Path:
    """Where to read the secret file ``path``: systemd's copy when the service was given one by
    ``LoadCredential=NAME:PATH`` with NAME the file's name (``$CREDENTIALS_DIRECTORY/NAME``), else ``path``.
    So the file itself can stay readable by root only while the service runs as its own user, and the
    same config works outside the unit (``watchd engine --check`` as root)."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if directory:
        credential = Path(directory) / path.name
        if credential.is_file():
            return credential
    return path


def check_secret_file(path: Path, key: str) -> None:
    """A secret file others could change is refused (ConfigError naming ``key`` and the file); one others
    may read is accepted with a warning. As OpenSSH's StrictModes (``safe_path``): the file is a regular
    file owned by this process's user or root and writable by neither its group nor others, and so is every
    directory on the way to it, each link followed (the directories of its target too): a directory
    writable by others is accepted only when sticky (``/tmp``), and then only for an entry (file, folder or
    link) of ours or root's, the one kind nobody else can remove or rename. OSError when it cannot be
    read."""
    problem, st = _walk(path)
    if problem is not None:
        raise ConfigError(f"{key}: {path}: {problem}; anyone who can change it can swap the secret")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o004:
        get_logger("watchd.config").warning(  # the logger the config loading has always named
            "secret_file_world_readable",
            key=key,
            path=str(path),
            mode=f"{mode:04o}",
            hint=f"chmod 600 {path}",
        )


#: links followed on the way to a secret file, at most (the kernel's own limit)
_MAX_LINKS = 40


def _trusted(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _writable_by(mode: int) -> str | None:
    if mode & 0o002:
        return "others"
    return "its group" if mode & 0o020 else None


def _walk(path: Path) -> tuple[str | None, os.stat_result]:
    """Follow ``path`` one name at a time as the kernel resolves it, checking each directory looked in and
    each entry found: (what is wrong, or None; the file's stat). OSError for a name that is not there."""
    todo = list(path.absolute().parts[1:])
    here = Path("/")  # always a real directory: no link in it
    links = 0
    st = os.lstat(here)
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            here = here.parent  # here has no link in it: its parent is the kernel's ".."
            st = os.lstat(here)
            continue
        folder = os.stat(here)
        if not _trusted(folder.st_uid):
            return f"the directory {here} is owned by uid {folder.st_uid} (not root, not us)", folder
        entry = here / name
        st = os.lstat(entry)
        kind = "the link" if stat.S_ISLNK(st.st_mode) else "the entry"
        writers = _writable_by(folder.st_mode)
        if writers is not None:
            mode = f"{stat.S_IMODE(folder.st_mode):04o}"
            if not folder.st_mode & stat.S_ISVTX:
                return f"the directory {here} is writable by {writers} (mode {mode})", st
            if not _trusted(st.st_uid):  # in a sticky directory only the entry's owner can replace it
                return (
                    f"{kind} {entry} is owned by uid {st.st_uid} in {here}, a sticky directory writable by "
                    f"{writers} (mode {mode})"
                ), st
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                return f"more than {_MAX_LINKS} links on the way (a loop?)", st
            target = Path(os.readlink(entry))
            if target.is_absolute():
                here = Path("/")
            todo[:0] = [p for p in target.parts if p != target.anchor]
            continue
        here = entry
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file", st
    if not _trusted(st.st_uid):
        return f"owned by uid {st.st_uid} (not root, not us: chown it)", st
    if (writers := _writable_by(st.st_mode)) is not None:
        return f"writable by {writers} (mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 {path}", st
    return None, st


class NamedToken(TokenSource):
    """A person's (or a dashboard's) credential: the name the audit records for what it does."""

    name: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[\w.@+-]+$")]

    @model_validator(mode="after")
    def _given(self) -> NamedToken:
        if self.token_file is None and self.token_env is None and self.token is None:
            raise ValueError(f"{self.name}: give one of token_file, token_env, token")
        return self


class EngineAuth(TokenSource):
    """The engine's credentials. The shared token (``token_file``/``token_env``/``token``) is the agents'
    (ingest). ``operators``: named tokens that may release, discard and resume (the audit records the name);
    ``viewers``: named tokens that may read ``/api/v1/*``. Only the shared token ingests: operators or
    viewers without it are refused at start. With neither, the shared token does both (the name recorded
    is ``X-Watchd-Operator``, marked unverified). With no credential at all, everything is open (``make
    demo``): the engine logs a warning at start."""

    operators: list[NamedToken] = Field(default_factory=list)
    viewers: list[NamedToken] = Field(default_factory=list)
    open_metrics: bool = True  # /metrics without a credential (Prometheus scrapes it)
    open_health: bool = True  # /healthz and /readyz without a credential (probes, load balancers)

    @model_validator(mode="after")
    def _distinct_names(self) -> EngineAuth:
        names = [t.name for t in [*self.operators, *self.viewers]]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"auth: the name {dup[0]} is given twice (operators and viewers)")
        return self


#: a libpq connection string or URI that carries a password
_DSN_PASSWORD = re.compile(r"password\s*=|://[^/@:]*:[^/@]*@", re.IGNORECASE)
#: the config fields that hold a secret itself (not where to read it): a token, a password, a DSN that may
#: carry one
_INLINE_SECRETS = ("token", "password", "dsn")


def inline_secrets(config: BaseModel) -> list[str]:
    """The keys of ``config`` that hold a secret inline (``auth.token``, ``auth.operators[0].token``,
    ``alertmanager.basic_auth.password``...), in the config's order."""
    found: list[str] = []

    def walk(value: Any, key: str) -> None:
        if isinstance(value, BaseModel):
            for name in type(value).model_fields:
                child = getattr(value, name)
                where = f"{key}.{name}" if key else name
                if name in _INLINE_SECRETS and isinstance(child, str):
                    if name != "dsn" or _DSN_PASSWORD.search(child):
                        found.append(where)
                else:
                    walk(child, where)
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                walk(item, f"{key}[{i}]")

    walk(config, "")
    return found


def readable_inline_secrets(config: BaseModel, path: Path | None) -> tuple[list[str], int]:
    """The inline secrets of ``config`` when its file ``path`` can be read by its group or others (none when
    it cannot, or there is no file), and the file's mode."""
    if path is None:
        return [], 0
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return [], 0
    return (inline_secrets(config) if mode & 0o044 else []), mode


def warn_inline_secrets(path: Path, keys: list[str], mode: int) -> None:
    """One warning per inline secret of a readable config, naming the file and the key."""
    for key in keys:
        get_logger("watchd.config").warning(
            "secret_inline_in_readable_config",
            key=key,
            path=str(path),
            mode=f"{mode:04o}",
            hint=inline_secret_hint(path, key, mode),
        )


def inline_secret_hint(path: Path, key: str, mode: int) -> str:
    """What to do about the inline secret ``key`` of the readable config ``path``."""
    field = key.rsplit(".", 1)[-1]
    who = "others" if mode & 0o004 else "its group"
    return (
        f"{path} (mode {mode:04o}) is readable by {who} and holds the secret {key} inline: put it in a file "
        f"of mode 0600 and name that file ({field}_file), or chmod 600 {path}"
    )
