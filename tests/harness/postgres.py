"""A real PostgreSQL server on loopback, for tests and benchmarks (issue 22: the shared state store).

A private cluster (``initdb``) under a temp dir, listening on 127.0.0.1 on a port picked free at start and
on a Unix socket in the temp dir. Host connections need the password (scram-sha-256) of the superuser
``watchd``; :attr:`PostgresServer.password_file` holds it, as a deployment would. PostgreSQL refuses to
run as root: as root the cluster belongs to (and the server runs as) the Debian package's ``postgres`` user.

Usage::

    with PostgresServer() as pg:
        db = pg.create_database()  # a fresh database per test: "host=127.0.0.1 port=... dbname=..."
        ...

``start()`` reaps the leftovers of a crashed earlier run (a harness dir whose owner pid is dead).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tests.harness.ports import free_port
from tests.harness.process import pid_alive, reap_stale_dirs

DIR_PREFIX = "watchd-pg-"
USER = "watchd"


def bindir() -> Path | None:
    """The newest installed PostgreSQL's binaries (Debian keeps them out of PATH)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


def available() -> tuple[bool, str]:
    """Whether a server can be started here; the reason when not."""
    if bindir() is None:
        return False, "PostgreSQL is not installed (Debian package postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return False, "running as root, and there is no postgres user to run the server as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False, "the Python driver psycopg is not installed"
    return True, ""


def _kill_leftover(d: Path) -> None:
    pid_file = d / "data" / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text().split()[0])
        if pid_alive(pid):
            os.kill(pid, signal.SIGQUIT)


class PostgresServer:
    def __init__(self) -> None:
        self.dir: Path | None = None
        self.port = 0
        self.password = "watchd-test-" + os.urandom(6).hex()
        self._db_names = itertools.count(1)
        self._as_postgres = os.geteuid() == 0

    @property
    def password_file(self) -> Path:
        assert self.dir is not None
        return self.dir / "password"

    def dsn(self, dbname: str = "postgres") -> str:
        """A DSN without the password (take it from :attr:`password_file`, as the engine's config does)."""
        return f"host=127.0.0.1 port={self.port} user={USER} dbname={dbname} connect_timeout=5"

    def dsn_with_password(self, dbname: str = "postgres") -> str:
        return f"{self.dsn(dbname)} password={self.password}"

    def _run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)

    def start(self) -> None:
        reap_stale_dirs(DIR_PREFIX, _kill_leftover)
        bin_ = bindir()
        if bin_ is None:
            raise RuntimeError("PostgreSQL is not installed")
        self.dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
        (self.dir / "owner.pid").write_text(str(os.getpid()))
        self.dir.chmod(0o755)
        pwfile = self.dir / "initpw"
        pwfile.write_text(self.password + "\n")
        self.password_file.write_text(self.password + "\n")
        self.password_file.chmod(0o600)
        data, run = self.dir / "data", self.dir / "run"  # the server's own: its data, socket and log
        data.mkdir(mode=0o700)
        run.mkdir(mode=0o755)
        if self._as_postgres:
            pg = pwd.getpwnam("postgres")
            for owned in (pwfile, data, run):
                os.chown(owned, pg.pw_uid, pg.pw_gid)
        init = self._run(
            str(bin_ / "initdb"),
            "-D",
            str(data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr[-2000:]}")
        pwfile.unlink()
        self.port = free_port()
        self._pg_ctl("start")

    def _pg_ctl(self, action: str, *args: str) -> None:
        bin_ = bindir()
        assert bin_ is not None and self.dir is not None
        data, run = self.dir / "data", self.dir / "run"
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={run}"
            " -c fsync=off -c max_connections=200 -c shared_buffers=32MB"
        )
        started = self._run(
            str(bin_ / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(run / "server.log"),
            "-o",
            opts,
            *args,
            "-w",
            "-t",
            "60",
            action,
        )
        if started.returncode != 0:
            log = (run / "server.log").read_text() if (run / "server.log").exists() else ""
            raise RuntimeError(f"pg_ctl {action} failed: {started.stderr[-1000:]} {log[-2000:]}")
        self._wait_ready()

    def restart(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: every session ended at once, as a restart by an operator or a
        failover does) and start it again on the same port and data: the clients' connections break."""
        self._pg_ctl("restart", "-m", mode)

    def terminate_sessions(self, application_name: str) -> int:
        """``pg_terminate_backend`` of every session of ``application_name`` (the engine's is
        ``watchd-engine``): the client sees its connection broken at its next statement. How many."""
        import psycopg

        with psycopg.connect(self.dsn_with_password(), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND pid <> pg_backend_pid()",
                (application_name,),
            ).fetchall()
        return sum(1 for r in rows if r[0])

    def chown_to_server(self, path: Path) -> None:
        """Give ``path`` to the user the server runs as (a tablespace's directory must be its)."""
        if self._as_postgres:
            pg = pwd.getpwnam("postgres")
            os.chown(path, pg.pw_uid, pg.pw_gid)

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.dsn_with_password(), autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def create_database(self) -> str:
        """A fresh, empty database; returns its name."""
        import psycopg

        name = f"watchd_{os.getpid()}_{next(self._db_names)}"
        with psycopg.connect(self.dsn_with_password(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def stop(self) -> None:
        if self.dir is None:
            return
        bin_ = bindir()
        if bin_ is not None:
            self._run(str(bin_ / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
