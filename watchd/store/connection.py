"""The one SQLite connection every repository of the state database shares, and its error handling."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from watchd.errors import UsageError


class StoreError(UsageError):
    """The state database cannot be used; the message names the file and says why (printed as one line)."""


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


class Tx:
    """The connection inside a write transaction: ``execute`` and ``executemany`` as sqlite3's, every text
    parameter passed through :func:`text` (so a lone surrogate is stored escaped, never raised)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, args: Iterable[Any] = ()) -> sqlite3.Cursor:
        return self._conn.execute(sql, _clean(args))

    def executemany(self, sql: str, rows: Iterable[Iterable[Any]]) -> sqlite3.Cursor:
        return self._conn.executemany(sql, (_clean(r) for r in rows))


#: called with (operation, error) on every failure: the engine counts them and reports the store unwritable
ErrorListener = Callable[[str, StoreError], None]
#: called after every committed write: the store is writable again
WriteListener = Callable[[], None]


class Connection:
    """One open database: transactions, reads, and every failure of the driver (sqlite3's errors, and any
    other exception it raises, such as UnicodeEncodeError) as a StoreError naming the file."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn: sqlite3.Connection | None = conn
        self.path = path
        self.on_error: ErrorListener | None = None
        self.on_write: WriteListener | None = None

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA optimize")
            conn.close()

    def live(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self.path}: the state database is closed")
        return self._conn

    def error(self, doing: str, exc: BaseException, operation: str = "write") -> StoreError:
        err = StoreError(text(f"{self.path}: {doing}: {exc}"))
        if self.on_error is not None:
            self.on_error(operation, err)
        return err

    @contextlib.contextmanager
    def write(self, doing: str) -> Iterator[Tx]:
        """One write transaction. IMMEDIATE takes the write lock up front, so a read-then-write can never
        fail half-way on a lock upgrade, and busy_timeout applies."""
        conn = self.live()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield Tx(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
        except StoreError:
            raise
        except (sqlite3.Error, ValueError, TypeError, OverflowError, MemoryError) as exc:
            # ValueError covers UnicodeEncodeError (a lone surrogate) and sqlite3's "embedded null"
            raise self.error(doing, exc) from None
        if self.on_write is not None:
            self.on_write()

    def one(self, doing: str, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Row | None:
        try:
            row: sqlite3.Row | None = self.live().execute(sql, _clean(args)).fetchone()
        except (sqlite3.Error, ValueError, TypeError, OverflowError) as exc:
            raise self.error(doing, exc, "read") from None
        return row

    def all(self, doing: str, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        try:
            return self.live().execute(sql, _clean(args)).fetchall()
        except (sqlite3.Error, ValueError, TypeError, OverflowError) as exc:
            raise self.error(doing, exc, "read") from None

    def delete(self, doing: str, sql: str, args: tuple[Any, ...]) -> int:
        with self.write(doing) as conn:
            return conn.execute(sql, args).rowcount


def dump(value: Mapping[str, Any]) -> str:
    """A JSON column, canonical (sorted keys, no spaces)."""
    return json.dumps(dict(value), sort_keys=True, separators=(",", ":"))
