"""The state database on PostgreSQL (the shared store of an HA pair of engines), through psycopg 3.

The repositories are synchronous on the event loop (see :mod:`watchd.store.database`), so this driver is
psycopg's synchronous connection, in autocommit mode with explicit transactions, as the SQLite driver: one
round trip per statement on loopback or a LAN (~0.1-0.5 ms), bounded by ``lock_timeout`` (a lock held by
someone else), ``statement_timeout`` (a stalled server) and ``connect_timeout``; a session left idle inside a
transaction (a process paused with SIGSTOP, a partition) is ended by the server after
``idle_in_transaction_session_timeout``, so it never holds the lease row's lock for ever. A broken connection
(the server restarted, a network blip) is reopened at the next call, outside a transaction.

Statements are written in SQLite's dialect and translated by :func:`watchd.store.dialect.dml`; the migrations
by :func:`watchd.store.dialect.ddl`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from watchd.extras import missing_extra

try:
    import psycopg
    from psycopg import pq
    from psycopg.conninfo import conninfo_to_dict
except ImportError as exc:  # the optional dependency: name the extra, not a traceback
    raise missing_extra("postgres", exc) from exc

from watchd.store.connection import StoreError
from watchd.store.dialect import POSTGRES, ddl, dml

_TX = pq.TransactionStatus
_IN_TRANSACTION = (_TX.INTRANS, _TX.INERROR, _TX.ACTIVE)

#: the advisory lock taken by a migration (one migrator at a time, across engines)
_MIGRATION_LOCK = 0x77617463686400  # "watchd\0"


class PgRow:
    """A row by position or by column name, as sqlite3.Row."""

    __slots__ = ("_names", "_values")

    def __init__(self, names: dict[str, int], values: Sequence[Any]) -> None:
        self._names = names
        self._values = values

    def __getitem__(self, key: int | str, /) -> Any:
        if isinstance(key, str):
            return self._values[self._names[key]]
        return self._values[key]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Any:
        return iter(self._values)


def _rows(cursor: Any) -> Any:
    names = {d.name: i for i, d in enumerate(cursor.description or ())}

    def make(values: Sequence[Any]) -> PgRow:
        return PgRow(names, values)

    return make


class PgResult:
    """What a statement returned: its row count, the id an INSERT into an identity table returned, rows."""

    def __init__(self, cursor: psycopg.Cursor[Any], returned_id: bool) -> None:
        self._cursor = cursor
        self.rowcount = cursor.rowcount
        self.lastrowid: int | None = None
        if returned_id:
            row = cursor.fetchone()
            self.lastrowid = None if row is None else int(row[0])

    def fetchone(self) -> Any:
        return self._cursor.fetchone() if self._cursor.description is not None else None

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall() if self._cursor.description is not None else []


def _param(value: Any) -> Any:
    # PostgreSQL's text cannot hold NUL: store its escape, as a lone surrogate's (connection.text)
    return value.replace("\x00", "\\x00") if isinstance(value, str) and "\x00" in value else value


def describe(conninfo: str) -> str:
    """The database as named in errors and logs: ``postgresql://user@host:port/dbname``, never a password."""
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "postgresql://(unparseable connection string)"
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    user = f"{parts['user']}@" if parts.get("user") else ""
    return f"postgresql://{user}{host}:{parts.get('port') or 5432}/{parts.get('dbname') or ''}"


class PgDriver:
    dialect = POSTGRES
    errors: tuple[type[Exception], ...] = (psycopg.Error,)

    def __init__(self, connect: Any, name: str, identity: frozenset[str]) -> None:
        self._connect = connect
        self.name = name
        self._identity = identity
        self._conn: psycopg.Connection[Any] = connect()

    @classmethod
    def connect(
        cls,
        conninfo: str,
        password: str | None,
        *,
        identity: frozenset[str],
        lock_timeout_s: float,
        statement_timeout_s: float,
        connect_timeout_s: float,
    ) -> PgDriver:
        name = describe(conninfo)
        options = (
            f"-c lock_timeout={max(1, int(lock_timeout_s * 1000))}"
            f" -c statement_timeout={max(1, int(statement_timeout_s * 1000))}"
            f" -c idle_in_transaction_session_timeout={max(1000, int(statement_timeout_s * 1000))}"
        )
        extra: dict[str, Any] = {"password": password} if password is not None else {}

        def connect() -> psycopg.Connection[Any]:
            return psycopg.connect(
                conninfo,
                autocommit=True,
                row_factory=_rows,
                options=options,
                application_name="watchd-engine",
                connect_timeout=max(1, int(connect_timeout_s)),
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
                **extra,
            )

        try:
            return cls(connect, name, identity)
        except psycopg.Error as exc:
            raise StoreError(f"{name}: cannot open the state database: {_first_line(exc)}") from None

    def _live(self) -> psycopg.Connection[Any]:
        if self._conn.closed or self._conn.broken:
            self._conn = self._connect()  # outside a transaction only: see execute
        return self._conn

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> PgResult:
        query = dml(sql, self._identity)
        conn = self._conn if self.in_transaction else self._live()
        cursor = conn.execute(query, tuple(_param(a) for a in args))
        returned_id = query.endswith(" RETURNING id") and "RETURNING" not in sql.upper()
        return PgResult(cursor, returned_id)

    def executemany(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> PgResult:
        query = dml(sql, self._identity)
        with self._conn.cursor() as cursor:
            cursor.executemany(query, [tuple(_param(a) for a in r) for r in rows])
            return PgResult(cursor, False)

    def ddl(self, statement: str) -> None:
        self._conn.execute(ddl(statement))

    def begin(self) -> None:
        self._live().execute("BEGIN")

    def commit(self) -> None:
        self._conn.execute("COMMIT")

    def rollback(self) -> None:
        if not self._conn.closed and self.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except psycopg.Error:
                self._conn.close()  # a connection that cannot roll back is reopened at the next call

    @property
    def in_transaction(self) -> bool:
        status = self._conn.info.transaction_status  # UNKNOWN when the connection is gone: none then
        return status in _IN_TRANSACTION

    def tables(self) -> set[str]:
        rows = self._conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
        return {str(r[0]) for r in rows}

    def lock_migrations(self) -> None:
        self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))

    def close(self) -> None:
        self._conn.close()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
