"""The engine's durable state, in one embedded SQLite database, so that a restart (clean or ``kill -9``)
neither repeats nor forgets an action nor resets the safety breaker.

What it holds: the audit trail; the action intents (a write-ahead log of decisions: an intent is written
before the scheduler is touched and finished after, so :meth:`Intents.unfinished` lists exactly what a
crash interrupted); cooldowns per action key (``"drain:gpu-7"``); the breaker window (which nodes of a pool
were disrupted when); the actions held for a human; what the rules remember (count windows, ``for`` holds,
``unless`` sightings, rule cooldowns: a snapshot, saved every few seconds and at shutdown); the alerts
firing; and a small key/value ``meta`` table.

One connection, one repository per concern: ``store.audit``, ``store.intents`` (with the cooldowns, which an
intent starts and finishes in the same transaction), ``store.held``, ``store.alerts`` (firing),
``store.rule_state``, ``store.breaker`` (the window) and ``store.meta``; the schema's migrations are in
:mod:`watchd.store.schema`.

Durability: the journal is WAL with ``synchronous=NORMAL``. A committed call survives a crash of the process
(``kill -9``, OOM kill, a segfault): its pages are in the WAL file, in the kernel's cache, before the call
returns. A power loss or kernel crash may lose the last few commits (the WAL is fsynced at checkpoints, not
at each commit), but never corrupts the database.

Synchronous on the event loop, deliberately: every call is one small local transaction (an indexed insert,
update or select) that commits without an fsync, tens of microseconds, less than decoding one ingest batch.
Handing each to a thread would cost more than the call and would reorder writes. The one wait is the lock:
a second process writing the same file (the CLI releasing a held action) holds it for a millisecond or so;
``busy_timeout`` bounds the wait and a call that still cannot get the lock raises :class:`StoreError`. The
engine opens it with 0.1 s (``watchd.store.opening.BUSY_TIMEOUT_S``): a lock held longer by someone else
fails the write (the batch is answered 503 and sent again) rather than stalling the event loop.

Times are float seconds since the epoch, always passed in by the caller: nothing here reads a clock.
Every failure of the database (unreadable, corrupt, locked, disk full, read-only, text it cannot encode) is
a :class:`StoreError` naming the file, never a traceback from deep inside sqlite3. Text SQLite cannot store
(a lone surrogate) is stored escaped (``\\udc80``) rather than refused.

Writable: :meth:`Store.open` refuses a file it cannot write (a write probe), and :attr:`Store.health` follows
every write after: a failed write marks the store unwritable (with the reason), the next committed write (or
:meth:`Store.probe`, run periodically by the engine) marks it writable again. The engine reports it on
``/readyz``, ``/healthz`` and in its metrics, and refuses ingest (503) while decisions cannot be recorded.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchd.store.alerts import FiringAlerts
from watchd.store.audit import AuditLog
from watchd.store.breaker import BreakerWindow
from watchd.store.checks import CheckRuns
from watchd.store.command_bindings import CommandBindings
from watchd.store.connection import Connection, SqliteDriver, StoreError
from watchd.store.dialect import POSTGRES, identity_tables
from watchd.store.held import HeldActions
from watchd.store.intents import Intents
from watchd.store.meta import Meta
from watchd.store.node_records import NodeRecords
from watchd.store.reliability import ReliabilityRecord
from watchd.store.rule_state import RuleStates
from watchd.store.schema import MIGRATIONS, SCHEMA_VERSION
from watchd.store.usage import JobUsage

DEFAULT_BUSY_TIMEOUT_S = 5.0
PROBE_KEY = "write_probe"


@dataclass
class StoreHealth:
    """Whether the last write succeeded; the reason when not; failures counted since the open."""

    writable: bool = True
    reason: str = ""
    failures: int = 0  # failed writes since the open
    last_error: str = ""  # the last failed write's error, kept after writes resume
    fenced: int = 0  # writes refused by the fence since the open (a follower's, a deposed leader's)


class Store:
    """The state database. Open with :meth:`open` (SQLite) or :meth:`open_postgres`; one instance per thread
    (sqlite3's rule)."""

    def __init__(self, db: Connection) -> None:
        self._db = db
        self.path = db.path
        #: the dialect: "sqlite" (embedded, one engine) or "postgres" (shared by the engines of an HA pair)
        self.dialect = db.dialect
        self.audit = AuditLog(self._db)
        self.intents = Intents(self._db)
        self.held = HeldActions(self._db)
        self.alerts = FiringAlerts(self._db)
        self.rule_state = RuleStates(self._db)
        self.breaker = BreakerWindow(self._db)
        self.meta = Meta(self._db)
        self.checks = CheckRuns(self._db)  # active checks
        self.reliability = ReliabilityRecord(self._db)
        self.usage = JobUsage(self._db)  # the usage report's observations
        self.nodes = NodeRecords(self._db)  # remediations done, marks, drain generations
        self.command_bindings = CommandBindings(self._db)  # which agent run a command was handed to
        self.health = StoreHealth()
        self._listeners: list[Callable[[str, StoreError], None]] = []
        self._db.on_error = self._failed
        self._db.on_write = self._wrote

    @property
    def shared(self) -> bool:
        """Whether other engines may use this database too (a server, not an embedded file)."""
        return self.dialect == POSTGRES

    @property
    def connection(self) -> Connection:
        """The one connection (the leader election fences its writes: :attr:`Connection.fence`)."""
        return self._db

    def on_error(self, listener: Callable[[str, StoreError], None]) -> None:
        """Call ``listener(operation, error)`` on every failure (``operation``: write, read or fenced)."""
        self._listeners.append(listener)

    def _failed(self, operation: str, error: StoreError) -> None:
        if operation == "fenced":  # not the leader: the decision is not recorded, the database is fine
            self.health.fenced += 1
            self.health.last_error = str(error)
        elif operation != "read":
            self.health.failures += 1
            self.health.writable = False
            self.health.reason = self.health.last_error = str(error)
        for listener in self._listeners:
            listener(operation, error)

    def _wrote(self) -> None:
        if not self.health.writable:
            self.health.writable = True
            self.health.reason = ""

    def probe(self, now: float) -> bool:
        """Write one row (the time of the probe in ``meta``): whether the database takes writes now. Updates
        :attr:`health` either way; never raises. On a shared database the row is written and rolled back (the
        server took the write; nothing of a follower's is left in the leader's state)."""
        if self.shared:
            return self._probe_rolled_back()
        try:
            self.meta.set(PROBE_KEY, repr(now))
        except StoreError:
            return False
        return True

    def _probe_rolled_back(self) -> bool:
        driver = self._db.live()
        errors: tuple[type[Exception], ...] = (*driver.errors, ValueError)
        try:
            driver.begin()
            try:
                driver.execute(
                    "INSERT INTO meta (key, value) VALUES (?, '')"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (PROBE_KEY,),
                )
            finally:
                driver.rollback()
        except errors as exc:
            self._db.error("probing writes", exc)
            return False
        self._wrote()
        return True

    @classmethod
    def open(cls, path: Path | str, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Store:
        """Open (creating it if needed) and migrate the database at ``path``; ``":memory:"`` for tests.

        Raises StoreError naming ``path`` when the file cannot be opened, is not a database, is corrupt,
        belongs to something else or was written by a newer watchd."""
        name = str(path)
        try:
            conn = sqlite3.connect(name, isolation_level=None, timeout=busy_timeout_s)
        except sqlite3.Error as exc:
            raise StoreError(f"{name}: cannot open the state database: {exc}") from None
        conn.row_factory = sqlite3.Row
        store = cls(Connection(SqliteDriver(conn), name))
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            store._migrate()
            if name != ":memory:":
                store._write_probe()
        except (sqlite3.Error, ValueError) as exc:
            conn.close()
            raise store._db.error("cannot open the state database", exc) from None
        except StoreError:
            conn.close()
            raise
        return store

    @classmethod
    def open_postgres(
        cls,
        conninfo: str,
        password: str | None = None,
        *,
        lock_timeout_s: float = 1.0,
        statement_timeout_s: float = 5.0,
        connect_timeout_s: float = 5.0,
    ) -> Store:
        """Connect to (and migrate) the PostgreSQL database ``conninfo`` (a libpq connection string or URI,
        its password given apart). Raises StoreError naming the database (never the password) when it cannot
        be reached, authenticated, written, or was written by a newer watchd."""
        from watchd.store.postgres import PgDriver

        driver = PgDriver.connect(
            conninfo,
            password,
            identity=identity_tables(MIGRATIONS),
            lock_timeout_s=lock_timeout_s,
            statement_timeout_s=statement_timeout_s,
            connect_timeout_s=connect_timeout_s,
        )
        store = cls(Connection(driver, driver.name))
        try:
            store._migrate()
            store._write_probe()
        except StoreError:
            store.close()
            raise
        except driver.errors as exc:
            store.close()
            raise StoreError(f"{driver.name}: cannot open the state database: {exc}") from None
        return store

    def close(self) -> None:
        """Close the database; idempotent. Later calls raise StoreError."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema_version(self) -> int:
        row = self._db.one("reading the schema version", "SELECT MAX(version) FROM schema_version")
        return int(row[0]) if row is not None and row[0] is not None else 0

    def check(self) -> None:
        """Run SQLite's full integrity check (reads the whole file); raises StoreError listing problems. On
        PostgreSQL the server keeps its own integrity (checksums, WAL): this checks the schema is current."""
        if self.shared:
            if self.schema_version() != SCHEMA_VERSION:
                raise StoreError(f"{self.path}: the schema is not at version {SCHEMA_VERSION}")
            return
        rows = self._db.all("checking integrity", "PRAGMA integrity_check")
        problems = [str(r[0]) for r in rows]
        if problems != ["ok"]:
            raise StoreError(f"{self.path}: the state database is corrupt: {'; '.join(problems[:5])}")

    def _write_probe(self) -> None:
        """Refuse a database this process cannot write (a 0444 file, a read-only mount, a standby server):
        every decision would fail to be recorded. One committed write, as every decision makes."""
        driver = self._db.live()
        try:
            driver.begin()
            try:
                driver.execute(
                    "INSERT INTO meta (key, value) VALUES (?, '') ON CONFLICT (key) DO NOTHING", (PROBE_KEY,)
                )
                driver.execute("UPDATE meta SET value = value WHERE key = ?", (PROBE_KEY,))
                driver.commit()
            except BaseException:
                driver.rollback()
                raise
        except driver.errors as exc:
            raise StoreError(f"{self.path}: the state database cannot be written: {exc}") from None

    def _migrate(self) -> None:
        driver = self._db.live()
        driver.begin()  # one migrator at a time, across processes
        try:
            driver.lock_migrations()
            tables = driver.tables()
            if tables and "schema_version" not in tables:
                raise StoreError(
                    f"{self.path}: not a watchd state database (it holds tables {sorted(tables)[:5]})"
                )
            driver.ddl("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY)")
            row = driver.execute("SELECT MAX(version) FROM schema_version").fetchone()
            current = int(row[0]) if row[0] is not None else 0
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: written by a newer watchd (schema version {current}; "
                    f"this one knows up to {SCHEMA_VERSION})"
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version - 1]:
                    driver.ddl(statement)
                driver.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
            driver.commit()
        except BaseException:
            driver.rollback()
            raise
