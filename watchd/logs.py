"""structlog set-up: JSON lines when not on a terminal (journald, files), readable on a terminal.

Repeated lines are rate-limited (:class:`RepeatLimiter`): per (logger, event) key, the first ``limit`` lines
of an interval go through; the rest are counted, and one ``log_lines_suppressed`` line per key reports the
count when the interval ends (seen at the next log call) and at exit. A flood of one kind of line (an action
per event, a clock warning per event) then costs a few lines, not one per event; the audit and the
metrics keep the full record. Under systemd each line starts with its syslog priority (``<3>`` for an
error), so ``journalctl -p err`` finds the errors. :class:`LogConfig` is the daemons' ``log:`` section."""

from __future__ import annotations

import atexit
import io
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Literal

import structlog

from watchd.strict import Strict

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

#: Lines let through per (logger, event) key and interval, and the interval.
REPEAT_LIMIT = 20
REPEAT_INTERVAL_S = 60.0

EventDict = MutableMapping[str, Any]


class RepeatLimiter:
    """A structlog processor: the first ``limit`` lines of each (logger name, event) key per ``interval_s``
    pass; later ones are dropped and counted. When a key's interval has ended, the next log call (of any key)
    first writes one ``log_lines_suppressed`` line for it (``suppressed_event``, ``suppressed_logger``,
    ``suppressed``, ``interval_s``), rendered by ``render`` and written to the logger the key last used;
    :meth:`flush` writes every pending one (at exit). Errors and above are never suppressed, except a line
    that says it may be (``rate_limited=True``, taken out of the line): an error a fault repeats once per
    action or event (the state database failing under a burst), which the metrics count in full."""

    def __init__(
        self,
        render: Callable[[Any, str, EventDict], Any],
        limit: int = REPEAT_LIMIT,
        interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.render = render
        self.limit = limit
        self.interval_s = interval_s
        self.clock = clock
        # key -> [window start, lines seen in the window, suppressed in the window, logger, method]
        self._windows: dict[tuple[str, str], list[Any]] = {}
        self._next_expiry = float("inf")
        self._lock = threading.Lock()

    def __call__(self, logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
        limited = event_dict.pop("rate_limited", False)
        if method_name in ("error", "critical", "exception", "fatal") and not limited:
            return event_dict
        now = self.clock()
        key = (str(event_dict.get("logger", getattr(logger, "name", ""))), str(event_dict.get("event", "")))
        with self._lock:
            due = self._expired(now) if now >= self._next_expiry else []
            window = self._windows.get(key)
            if window is None or now - window[0] >= self.interval_s:
                window = [now, 0, 0, logger, method_name]
                self._windows[key] = window
                self._next_expiry = min(self._next_expiry, now + self.interval_s)
            window[1] += 1
            drop = window[1] > self.limit
            if drop:
                window[2] += 1
                window[3], window[4] = logger, method_name
        for summary in due:
            self._write(*summary)
        if drop:
            raise structlog.DropEvent
        return event_dict

    def _expired(self, now: float) -> list[tuple[Any, str, EventDict]]:
        """Pop the windows that ended; the summaries of those that suppressed lines. Holds the lock."""
        out: list[tuple[Any, str, EventDict]] = []
        next_expiry = float("inf")
        for key, window in list(self._windows.items()):
            if now - window[0] >= self.interval_s:
                del self._windows[key]
                if window[2]:
                    out.append(self._summary(key, window))
            else:
                next_expiry = min(next_expiry, window[0] + self.interval_s)
        self._next_expiry = next_expiry
        return out

    def _summary(self, key: tuple[str, str], window: list[Any]) -> tuple[Any, str, EventDict]:
        event: EventDict = {
            "event": "log_lines_suppressed",
            "suppressed_logger": key[0],
            "suppressed_event": key[1],
            "suppressed": window[2],
            "interval_s": self.interval_s,
        }
        return window[3], window[4], event

    def _write(self, logger: Any, method_name: str, event: EventDict) -> None:
        try:
            event["level"] = "warning"
            rendered = self.render(logger, method_name, event)
            logger.msg(rendered)
        except Exception:  # a summary must never break the caller's log call
            pass

    def flush(self) -> None:
        """Write the summaries of every window that suppressed lines (at exit), and forget them all."""
        with self._lock:
            pending = [self._summary(k, w) for k, w in self._windows.items() if w[2]]
            self._windows.clear()
            self._next_expiry = float("inf")
        for summary in pending:
            self._write(*summary)


class LogConfig(Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"
    # "<N>" before each line, the syslog priority systemd's journal reads (SyslogLevelPrefix=, on by
    # default): auto when the output is the journal (systemd's JOURNAL_STREAM names it)
    syslog_priority: Literal["auto", "always", "never"] = "auto"


#: The syslog priority (RFC 5424) of each log level: what ``journalctl -p`` filters on.
SYSLOG_PRIORITIES = {
    "critical": 2,
    "exception": 3,
    "error": 3,
    "warning": 4,
    "warn": 4,
    "info": 6,
    "debug": 7,
}


def writes_to_journal(stream: Any, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``stream`` is the journal's: systemd sets ``JOURNAL_STREAM=DEVICE:INODE`` for a service whose
    stdout or stderr is connected to the journal (systemd.exec(5)); a pipe or file it was redirected to has
    another device and inode."""
    try:
        device, inode = (int(part) for part in environ.get("JOURNAL_STREAM", "").split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError, io.UnsupportedOperation):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)


def with_syslog_priority(
    render: Callable[[Any, str, EventDict], Any],
) -> Callable[[Any, str, EventDict], str]:
    """``render``, its line prefixed ``<N>`` with the syslog priority of the line's level."""

    def prefixed(logger: Any, method_name: str, event: EventDict) -> str:
        priority = SYSLOG_PRIORITIES.get(str(event.get("level", method_name)), 6)
        return f"<{priority}>{render(logger, method_name, event)}"

    return prefixed


_active: RepeatLimiter | None = None


def _flush_at_exit() -> None:
    if _active is not None:
        _active.flush()


atexit.register(_flush_at_exit)


def configure_logging(
    level: str = "info", fmt: str = "auto", stream: Any = None, syslog_priority: str = "auto"
) -> None:
    """Log lines at ``level`` and above to ``stream`` (stderr), as JSON lines or for a terminal, each with
    its ``<N>`` syslog priority when ``syslog_priority`` is ``always``, or ``auto`` and the stream is the
    journal."""
    global _active
    stream = stream or sys.stderr
    as_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    if syslog_priority == "always" or (syslog_priority == "auto" and writes_to_journal(stream)):
        renderer = with_syslog_priority(renderer)
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)

    def render_summary(logger: Any, method_name: str, event: EventDict) -> Any:
        return renderer(logger, method_name, stamp(logger, method_name, event))

    if _active is not None:
        _active.flush()
    _active = RepeatLimiter(render_summary)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _active,
            stamp,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
