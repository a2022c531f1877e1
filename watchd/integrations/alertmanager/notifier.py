"""Alerts to Prometheus Alertmanager through its API v2 (``POST /api/v2/alerts``).

Behaviour of Alertmanager 0.25 this relies on (checked against a real one, see tests/test_alertmanager.py):

- The body is a JSON list of ``{labels, annotations, startsAt, endsAt, generatorURL}``, times in RFC3339.
  An alert is identified by its label set; re-sending it with the same labels updates annotations and
  ``endsAt`` and keeps the *earliest* ``startsAt``.
- ``endsAt`` in the future: the alert is active until then, and then resolves by itself. That is the dead-man
  switch: watchd re-sends its firing alerts every ``resend_interval`` with ``endsAt = now + 4 x interval``,
  so they stay while watchd lives and expire if it dies. ``endsAt = now`` resolves at once (a resolve with a
  later ``endsAt`` than the one Alertmanager holds wins over it). ``endsAt`` before ``startsAt`` is refused.
- Resolved alerts disappear from ``GET /api/v2/alerts`` at once, whatever the ``active``/``silenced``/
  ``inhibited`` filters (``active=false`` does not show them); Alertmanager counts them in
  ``alertmanager_alerts_received_total{status="resolved"}``.
- Validation: a missing ``labels`` is 422, an empty label set, an invalid label or annotation name, or
  ``endsAt`` before ``startsAt`` is 400 -- but the *valid* alerts of that same batch are stored anyway.
  :class:`~watchd.integrations.alerts.Alert` checks names up front, so a 4xx means a bug: it is logged as an
  error, counted as ``rejected`` and not retried.
- An HA pair (or more) does not replicate alerts from clients: every instance is sent every alert.

Delivery goes through :class:`~watchd.integrations.webhook.sender.WebhookSender` (the one place with
retries). Posts to
one Alertmanager are serialized (a re-send of the firing set can never overtake a later resolve); different
Alertmanagers are sent to concurrently. An Alertmanager that failed a whole send is marked *down*: until it
answers again every send to it makes a single attempt, so a dead one cannot hold callers for
``max_attempts`` timeouts each time. Nothing is raised to the caller for a delivery failure.

The firing set lives in memory only. After a restart, the engine must fire again what still holds; alerts of
the previous process that nobody fires again expire after ``4 x resend_interval``. Leaving the context
manager does *not* resolve the firing alerts (a restart must not flap them).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import TypedDict

from prometheus_client import CollectorRegistry, Counter, Gauge

from watchd.clock import Clock, SystemClock
from watchd.errors import ConfigError
from watchd.httputil import client_tls
from watchd.integrations.alertmanager.settings import AlertmanagerConfig
from watchd.integrations.alerts import Alert
from watchd.integrations.webhook.sender import WebhookResult, WebhookSender, redact_url
from watchd.logs import get_logger
from watchd.periodic import Periodic

_log = get_logger("watchd.alertmanager")

ALERTS_PATH = "/api/v2/alerts"
# endsAt of a firing alert = now + EXPIRY_FACTOR * resend_interval (Prometheus itself uses 4 x its interval)
EXPIRY_FACTOR = 4


def rfc3339(t: float) -> str:
    """Unix seconds -> ``2024-05-01T12:00:00.123Z`` (UTC, millisecond precision)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AlertMetrics:
    """The notifier's metrics. One set per registry: two notifiers need two registries."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sent = Counter(
            "watchd_alerts_sent",
            "Alerts sent to Alertmanager, by receiver (base URL) and outcome (delivered, rejected, failed); "
            "one per alert per receiver per send, retries not counted.",
            ["receiver", "outcome"],
            registry=registry,
        )
        self.firing = Gauge("watchd_alerts_firing", "Alerts watchd holds firing now.", registry=registry)
        self.up = Gauge(
            "watchd_alertmanager_up",
            "1 when the last send to this Alertmanager was delivered, 0 when it failed.",
            ["receiver"],
            registry=registry,
        )


class FiringState(TypedDict):
    """One firing alert as :meth:`AlertmanagerNotifier.state` reports it (JSON-ready)."""

    key: str
    labels: dict[str, str]
    annotations: dict[str, str]
    generatorURL: str
    startsAt: str  # RFC3339
    acked: list[str]  # the Alertmanagers that accepted the current version


class ReceiverState(TypedDict):
    """One Alertmanager as :meth:`AlertmanagerNotifier.receivers` reports it (JSON-ready)."""

    url: str  # without user:password
    up: bool
    last_outcome: str  # delivered | rejected | failed | "" (nothing sent yet)
    last_error: str
    last_attempt_at: str | None
    last_delivered_at: str | None


@dataclass(slots=True)
class _Firing:
    key: str
    alert: Alert
    starts_at: float
    acked: set[str] = field(default_factory=set)  # receivers that accepted this version of the alert


@dataclass(slots=True)
class _Receiver:
    base: str
    endpoint: str
    label: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    up: bool = True
    last_outcome: str = ""
    last_error: str = ""
    last_attempt_at: float | None = None
    last_delivered_at: float | None = None


_Batch = list[dict[str, object]]


class AlertmanagerNotifier:
    """The real :class:`~watchd.integrations.alerts.AlertSink`.

    Use as ``async with AlertmanagerNotifier(...)``:
    the context runs the periodic re-send and owns the HTTP session. The re-send is a job of ``periodic``
    when given (the engine's, which starts and stops it), else of the notifier's own.

    ``urls`` are Alertmanager base URLs (``http://am-1:9093``, with the route prefix if one is set); every
    one is notified. ``fire``/``resolve`` send at once and return when each Alertmanager has answered or
    its attempts are spent: at most ``max_attempts`` x ``timeout`` plus backoff (one ``timeout`` for an
    Alertmanager already marked down).

    ``external_labels`` are added to every alert sent (not to its identity here: ``state()`` shows the
    alert's own labels); ``headers`` carry the credentials (``Authorization``) and ``tls`` the context for
    https:// Alertmanagers (a private CA, a client certificate)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        registry: CollectorRegistry,
        clock: Clock | None = None,
        resend_interval: float = 60.0,
        timeout: float = 5.0,
        max_attempts: int = 4,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        headers: dict[str, str] | None = None,
        periodic: Periodic | None = None,
        external_labels: Mapping[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one Alertmanager URL is needed")
        if resend_interval <= 0:
            raise ValueError("resend_interval must be > 0")
        self.clock: Clock = clock or SystemClock()
        self.resend_interval = resend_interval
        self.max_attempts = max_attempts
        self.metrics = AlertMetrics(registry)
        self._sender = WebhookSender(
            timeout=timeout,
            max_attempts=max_attempts,
            backoff=backoff,
            max_backoff=max_backoff,
            headers=headers,
            log_failures=False,
            tls=tls,
        )
        self.external_labels = dict(external_labels or {})
        self._receivers: list[_Receiver] = []
        for url in dict.fromkeys(u.rstrip("/") for u in urls):  # de-duplicated, order kept
            rcv = _Receiver(base=url, endpoint=url + ALERTS_PATH, label=redact_url(url))
            self._receivers.append(rcv)
            self.metrics.up.labels(rcv.label).set(1)
        self._firing: dict[str, _Firing] = {}
        self._periodic = periodic
        self._own_periodic: Periodic | None = None

    # ------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> AlertmanagerNotifier:
        await self._sender.__aenter__()
        periodic = self._periodic
        if periodic is None:
            periodic = self._own_periodic = Periodic()
        # a failed re-send is logged and the job goes on: alerts would expire in Alertmanager without it
        periodic.every(self.resend_interval, self.resend, "alertmanager-resend")
        if self._own_periodic is not None:
            self._own_periodic.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop re-sending and close the HTTP session. Firing alerts are left to expire, not resolved."""
        if self._own_periodic is not None:
            await self._own_periodic.stop()
            self._own_periodic = None
        await self._sender.aclose()

    # ------------------------------------------------------------- AlertSink
    async def fire(self, key: str, alert: Alert) -> None:
        now = self.clock.now()
        old = self._firing.get(key)
        if old is not None and old.alert == alert and len(old.acked) == len(self._receivers):
            return  # nothing new for anyone: the periodic re-send keeps it alive
        replaced: _Firing | None = None
        if old is not None and old.alert.labels == alert.labels:
            f = _Firing(key, alert, old.starts_at)  # same alert in Alertmanager: keep its start
        else:
            replaced = old  # new alert, or its labels changed: a different alert in Alertmanager
            f = _Firing(key, alert, now)
        self._firing[key] = f
        self.metrics.firing.set(len(self._firing))
        if old is None:
            _log.info("alert_firing", key=key, alertname=alert.name, labels=dict(alert.labels))

        def batch() -> _Batch:
            t = self.clock.now()
            out = [self._payload(replaced, t)] if replaced is not None else []
            if self._firing.get(key) is f:  # not resolved or replaced meanwhile
                out.append(self._payload(f, t + EXPIRY_FACTOR * self.resend_interval))
            return out

        await self._deliver(batch, [f])

    async def resolve(self, key: str) -> None:
        f = self._firing.pop(key, None)
        if f is None:
            return
        self.metrics.firing.set(len(self._firing))
        _log.info("alert_resolved", key=key, alertname=f.alert.name, labels=dict(f.alert.labels))
        await self._deliver(lambda: [self._payload(f, self.clock.now())], [])

    # ------------------------------------------------------------- more
    async def resend(self) -> None:
        """Send every firing alert to every Alertmanager now (what the background loop does each interval)."""

        def batch() -> _Batch:
            t = self.clock.now() + EXPIRY_FACTOR * self.resend_interval
            return [self._payload(f, t) for f in self._firing.values()]

        if self._firing:
            await self._deliver(batch, list(self._firing.values()))

    def state(self) -> list[FiringState]:
        """The firing alerts, JSON-ready, for a status API: key, labels, annotations, generatorURL, startsAt
        and the Alertmanagers that accepted the current version (``acked``)."""
        return [
            {
                "key": f.key,
                "labels": dict(f.alert.labels),
                "annotations": dict(f.alert.annotations),
                "generatorURL": f.alert.generator_url,
                "startsAt": rfc3339(f.starts_at),
                "acked": sorted(f.acked),
            }
            for f in sorted(self._firing.values(), key=lambda f: f.key)
        ]

    def receivers(self) -> list[ReceiverState]:
        """Each Alertmanager's health as watchd sees it, JSON-ready, for a status API."""
        return [
            {
                "url": r.label,
                "up": r.up,
                "last_outcome": r.last_outcome,
                "last_error": r.last_error,
                "last_attempt_at": None if r.last_attempt_at is None else rfc3339(r.last_attempt_at),
                "last_delivered_at": None if r.last_delivered_at is None else rfc3339(r.last_delivered_at),
            }
            for r in self._receivers
        ]

    @property
    def firing_keys(self) -> list[str]:
        return sorted(self._firing)

    # ------------------------------------------------------------- delivery
    def _payload(self, f: _Firing, ends_at: float) -> dict[str, object]:
        return {
            # the external labels (cluster=...) under the alert's own: an alert's label of that name wins
            "labels": {**self.external_labels, **f.alert.labels},
            "annotations": dict(f.alert.annotations),
            "startsAt": rfc3339(f.starts_at),
            # Alertmanager refuses endsAt < startsAt (a clock step back, a fake clock): clamp
            "endsAt": rfc3339(max(ends_at, f.starts_at)),
            "generatorURL": f.alert.generator_url,
        }

    async def _deliver(self, build: Callable[[], _Batch], firing: list[_Firing]) -> None:
        await asyncio.gather(*(self._send_one(r, build, firing) for r in self._receivers))

    async def _send_one(self, rcv: _Receiver, build: Callable[[], _Batch], firing: list[_Firing]) -> None:
        async with rcv.lock:  # built under the lock: a batch never overtakes a later change
            batch = build()
            if not batch:
                return
            rcv.last_attempt_at = self.clock.now()
            res = await self._sender.post(
                rcv.endpoint, batch, max_attempts=self.max_attempts if rcv.up else 1
            )
        self._record(rcv, res, batch, firing)

    def _record(self, rcv: _Receiver, res: WebhookResult, batch: _Batch, firing: list[_Firing]) -> None:
        self.metrics.sent.labels(rcv.label, res.outcome).inc(len(batch))
        rcv.last_outcome, rcv.last_error = res.outcome, res.error
        names = sorted({str(a["labels"]["alertname"]) for a in batch if isinstance(a["labels"], dict)})
        if res.outcome == "delivered":
            rcv.last_delivered_at = self.clock.now()
            for f in firing:
                f.acked.add(rcv.label)
            if not rcv.up:
                _log.info("alertmanager_recovered", receiver=rcv.label)
            rcv.up = True
            self.metrics.up.labels(rcv.label).set(1)
            _log.debug("alerts_delivered", receiver=rcv.label, alerts=len(batch), attempts=res.attempts)
            return
        for f in firing:
            f.acked.discard(rcv.label)
        if res.outcome == "rejected":  # a bug in what watchd sends: loud, not retried
            _log.error(
                "alerts_rejected", receiver=rcv.label, status=res.status, error=res.error, alertnames=names
            )
            return
        was_up, rcv.up = rcv.up, False
        self.metrics.up.labels(rcv.label).set(0)
        _log.warning(
            "alerts_delivery_failed",
            receiver=rcv.label,
            attempts=res.attempts,
            status=res.status,
            error=res.error,
            alerts=len(batch),
            alertnames=names,
            marked_down=was_up,
        )


def notifier_from_settings(
    config: AlertmanagerConfig,
    *,
    registry: CollectorRegistry,
    clock: Clock | None = None,
    periodic: Periodic | None = None,
) -> AlertmanagerNotifier:
    """The notifier of the engine's ``alertmanager:`` section: its credentials read (ConfigError naming the
    key when a secret cannot be), its TLS context loaded (the same for a bad CA or certificate)."""
    return AlertmanagerNotifier(
        config.urls,
        registry=registry,
        clock=clock,
        resend_interval=config.resend_interval_s,
        timeout=config.timeout_s,
        periodic=periodic,
        headers=auth_headers(config),
        external_labels=config.external_labels,
        tls=alertmanager_tls(config),
    )


def auth_headers(config: AlertmanagerConfig) -> dict[str, str]:
    """``Authorization`` for the configured credentials (none: no header)."""
    if config.basic_auth is not None:
        password = config.basic_auth.resolve("alertmanager.basic_auth")
        pair = f"{config.basic_auth.username}:{password}".encode()
        header = "Basic " + base64.b64encode(pair).decode("ascii")
    elif config.bearer_token is not None:
        header = "Bearer " + (config.bearer_token.resolve("alertmanager.bearer_token") or "")
    else:
        return {}
    plain = [redact_url(u) for u in config.urls if u.startswith("http://")]
    if plain:
        _log.warning("alertmanager_credentials_in_clear", urls=plain, hint="use https:// urls")
    return {"Authorization": header}


def alertmanager_tls(config: AlertmanagerConfig) -> ssl.SSLContext | None:
    """The client TLS context for https:// Alertmanagers when a CA or a client certificate is configured
    (else None: aiohttp's default, the system's CAs)."""
    if config.ca_file is None and config.client_cert is None:
        return None
    try:
        return client_tls(config.ca_file, config.client_cert, config.client_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"alertmanager.ca_file/client_cert/client_key: cannot load: {exc}") from None
