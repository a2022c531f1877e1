"""The one connection every repository of the state database shares (SQLite, or PostgreSQL through
:mod:`watchd.store.postgres`), its transactions, its fence (HA), and its error handling."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from watchd.errors import UsageError


class StoreError(UsageError):
    """The state database cannot be used; the message names the file and says why (printed as one line)."""


def store_failed(exc: StoreError) -> str:
    """What an action's outcome says when the state database failed under it (its error names the
    database and what was being done)."""
    return f"the state database failed: {exc}"


def text(value: str) -> str:
    """``value`` as SQLite can store it: a lone surrogate (which UTF-8 cannot encode, so sqlite3 would raise
    UnicodeEncodeError) is written as its escape, ``\\udc80``; any other text is returned as it is."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def _clean(args: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(text(a) if isinstance(a, str) else a for a in args)


class Row(Protocol):
    """A result row, by position or by column name (sqlite3.Row; the PostgreSQL driver's rows alike)."""

    def __getitem__(self, key: int | str, /) -> Any: ...


class Result(Protocol):
    """What a statement returns: sqlite3's cursor, or the PostgreSQL driver's equivalent."""

    @property
    def rowcount(self) -> int: ...

    @property
    def lastrowid(self) -> int | None: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Driver(Protocol):
    """One open database of one dialect (:mod:`watchd.store.dialect`): statements in SQLite's dialect, run as
    the database needs them. ``errors``: what the driver raises (each becomes a StoreError)."""

    dialect: str
    errors: tuple[type[Exception], ...]

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> Result: ...

    def executemany(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> Result: ...

    def ddl(self, statement: str) -> None: ...

    def begin(self) -> None: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    @property
    def in_transaction(self) -> bool: ...

    def tables(self) -> set[str]: ...

    def lock_migrations(self) -> None: ...

    def close(self) -> None: ...


class SqliteDriver:
    """The embedded default: one sqlite3 connection in autocommit mode, transactions begun IMMEDIATE (the
    write lock up front, so a read-then-write never fails half-way on a lock upgrade)."""

    dialect = "sqlite"
    errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, args)

    def executemany(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> sqlite3.Cursor:
        return self.conn.executemany(sql, rows)

    def ddl(self, statement: str) -> None:
        self.conn.execute(statement)

    def begin(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def tables(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def lock_migrations(self) -> None:
        pass  # BEGIN IMMEDIATE already holds the one write lock

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute("PRAGMA optimize")
        self.conn.close()


class Tx:
    """The connection inside a write transaction: ``execute`` and ``executemany`` as sqlite3's, every text
    parameter passed through :func:`text` (so a lone surrogate is stored escaped, never raised)."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    def execute(self, sql: str, args: Iterable[Any] = ()) -> Result:
        return self._driver.execute(sql, _clean(args))

    def executemany(self, sql: str, rows: Iterable[Iterable[Any]]) -> Result:
        return self._driver.executemany(sql, (_clean(r) for r in rows))


class Fenced(StoreError):
    """A write refused because this engine's fencing token is no longer the lease's (a deposed
    leader that wakes up late writes nothing)."""


class Fence(Protocol):
    """Checked inside every write transaction, before its first statement: raises :class:`Fenced` unless this
    process still holds the lease with the token it was given (the check locks the lease row, so a takeover
    waits for the transaction, and a transaction after the takeover sees the new token)."""

    def check(self, tx: Tx) -> None: ...


#: called with (operation, error) on every failure: the engine counts them and reports the store unwritable
ErrorListener = Callable[[str, StoreError], None]
#: called after every committed write: the store is writable again
WriteListener = Callable[[], None]


class Connection:
    """One open database: transactions, reads, and every failure of the driver (its errors, and any other
    exception it raises, such as UnicodeEncodeError) as a StoreError naming the database."""

    def __init__(self, driver: Driver, path: str) -> None:
        self._driver: Driver | None = driver
        self.path = path
        self.dialect = driver.dialect
        self.on_error: ErrorListener | None = None
        self.on_write: WriteListener | None = None
        #: when set (HA: a shared store and an elected leader), every write transaction checks it first
        self.fence: Fence | None = None

    def close(self) -> None:
        if self._driver is not None:
            driver, self._driver = self._driver, None
            with contextlib.suppress(*driver.errors):
                driver.close()

    def live(self) -> Driver:
        if self._driver is None:
            raise StoreError(f"{self.path}: the state database is closed")
        return self._driver

    def error(self, doing: str, exc: BaseException, operation: str = "write") -> StoreError:
        err = StoreError(text(f"{self.path}: {doing}: {exc}"))
        if self.on_error is not None:
            self.on_error(operation, err)
        return err

    def _errors(self) -> tuple[type[BaseException], ...]:
        return (*self.live().errors, ValueError, TypeError, OverflowError, MemoryError)

    @contextlib.contextmanager
    def write(self, doing: str, fenced: bool = True) -> Iterator[Tx]:
        """One write transaction; with a :attr:`fence` (unless ``fenced`` is False), checked first."""
        driver = self.live()
        errors = self._errors()
        try:
            driver.begin()
            try:
                tx = Tx(driver)
                if fenced and self.fence is not None:
                    self.fence.check(tx)
                yield tx
                driver.commit()
            except BaseException:
                driver.rollback()
                raise
        except Fenced as exc:
            err = Fenced(text(f"{self.path}: {doing}: {exc}"))
            if self.on_error is not None:
                self.on_error("fenced", err)
            raise err from None
        except StoreError:
            raise
        except errors as exc:
            # ValueError covers UnicodeEncodeError (a lone surrogate) and sqlite3's "embedded null"
            raise self.error(doing, exc) from None
        if self.on_write is not None:
            self.on_write()

    def one(self, doing: str, sql: str, args: tuple[Any, ...] = ()) -> Any:
        driver = self.live()
        errors: tuple[type[Exception], ...] = (*driver.errors, ValueError, TypeError, OverflowError)
        try:
            return driver.execute(sql, _clean(args)).fetchone()
        except errors as exc:
            raise self.error(doing, exc, "read") from None

    def all(self, doing: str, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        driver = self.live()
        errors: tuple[type[Exception], ...] = (*driver.errors, ValueError, TypeError, OverflowError)
        try:
            return driver.execute(sql, _clean(args)).fetchall()
        except errors as exc:
            raise self.error(doing, exc, "read") from None

    def delete(self, doing: str, sql: str, args: tuple[Any, ...]) -> int:
        with self.write(doing) as conn:
            return conn.execute(sql, args).rowcount


def dump(value: Mapping[str, Any]) -> str:
    """A JSON column, canonical (sorted keys, no spaces)."""
    return json.dumps(dict(value), sort_keys=True, separators=(",", ":"))
