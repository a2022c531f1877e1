"""AlertmanagerNotifier against real Alertmanagers (tests/harness/alertmanager.py), plus Alert and the fake.

The session Alertmanager is shared: every test uses alert names of its own.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from tests.harness.alertmanager import AlertmanagerProcess, free_port
from tests.support import eventually
from watchd.clock import FakeClock, SystemClock
from watchd.httputil import serve
from watchd.integrations.alertmanager.notifier import EXPIRY_FACTOR, AlertmanagerNotifier, rfc3339
from watchd.integrations.alerts import Alert, AlertSink, FakeAlertSink

Factory = Callable[..., AbstractAsyncContextManager[AlertmanagerNotifier]]


def unique(prefix: str = "WatchdTest") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def sent(reg: CollectorRegistry, receiver: str, outcome: str) -> float:
    return reg.get_sample_value("watchd_alerts_sent_total", {"receiver": receiver, "outcome": outcome}) or 0.0


def gauge(reg: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float | None:
    return reg.get_sample_value(name, labels or {})


def make_alert(name: str, **annotations: str) -> Alert:
    return Alert(
        labels={"alertname": name, "node": "gpu-1", "severity": "warning"},
        annotations=annotations or {"summary": "GPU fell off the bus", "runbook_url": "https://r/x79"},
        generator_url="http://watchd.example:9100/api/incidents/42",
    )


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def notifier(registry: CollectorRegistry) -> Factory:
    """``async with notifier(urls, resend_interval=..., clock=...) as n``: fast retries for tests."""

    @asynccontextmanager
    async def make(urls: list[str], **kw: Any) -> AsyncIterator[AlertmanagerNotifier]:
        kw.setdefault("timeout", 1.0)
        kw.setdefault("max_attempts", 3)
        kw.setdefault("backoff", 0.01)
        kw.setdefault("max_backoff", 0.05)
        async with AlertmanagerNotifier(urls, registry=registry, **kw) as n:
            yield n

    return make


# --------------------------------------------------------------------------- Alert, FakeAlertSink
def test_alert_needs_alertname_and_valid_names() -> None:
    with pytest.raises(ValueError, match="alertname"):
        Alert(labels={"node": "gpu-1"}, annotations={})
    with pytest.raises(ValueError, match="label name"):
        Alert(labels={"alertname": "X", "bad-name": "v"}, annotations={})
    with pytest.raises(ValueError, match="annotation name"):
        Alert(labels={"alertname": "X"}, annotations={"run book": "v"})
    labels = {"alertname": "X", "empty": ""}
    a = Alert(labels=labels, annotations={})
    labels["node"] = "changed later"
    assert a.labels == {"alertname": "X"}  # own copy; empty values dropped as Alertmanager drops them
    assert a.name == "X"


async def test_fake_sink_records() -> None:
    sink: AlertSink = FakeAlertSink()
    assert isinstance(sink, FakeAlertSink)
    a = make_alert("A")
    await sink.fire("k", a)
    await sink.fire("k", a)
    await sink.resolve("k")
    await sink.resolve("unknown")
    assert sink.firing == {}
    assert sink.resolved == {"k": a}
    assert [(c[0], c[1]) for c in sink.calls] == [
        ("fire", "k"),
        ("fire", "k"),
        ("resolve", "k"),
        ("resolve", "unknown"),
    ]


def test_rfc3339() -> None:
    assert rfc3339(1_700_000_000.5) == "2023-11-14T22:13:20.500Z"


# --------------------------------------------------------------------------- real Alertmanager
async def test_fire_is_visible_with_labels_annotations_and_generator_url(
    alertmanager: AlertmanagerProcess, notifier: Factory, registry: CollectorRegistry
) -> None:
    name = unique()
    clock = FakeClock(start=time.time())
    alert = make_alert(name)
    async with notifier([alertmanager.url], clock=clock, resend_interval=60) as n:
        await n.fire("xid79/gpu-1", alert)
        got = alertmanager.alert(name)
        assert got is not None
        assert got["labels"] == dict(alert.labels)
        assert got["annotations"] == dict(alert.annotations)
        assert got["generatorURL"] == alert.generator_url
        assert got["status"]["state"] == "active"
        assert ts(got["startsAt"]) == pytest.approx(clock.now(), abs=0.001)
        assert ts(got["endsAt"]) == pytest.approx(clock.now() + EXPIRY_FACTOR * 60, abs=0.001)
        assert sent(registry, alertmanager.url, "delivered") == 1
        assert gauge(registry, "watchd_alerts_firing") == 1
        assert gauge(registry, "watchd_alertmanager_up", {"receiver": alertmanager.url}) == 1
        [st] = n.state()
        assert st["key"] == "xid79/gpu-1"
        assert st["labels"] == dict(alert.labels)
        assert st["startsAt"] == rfc3339(clock.now())
        assert st["acked"] == [alertmanager.url]
        await n.resolve("xid79/gpu-1")


async def test_resend_keeps_start_and_moves_end(
    alertmanager: AlertmanagerProcess, notifier: Factory, registry: CollectorRegistry
) -> None:
    name = unique()
    t0 = time.time()
    clock = FakeClock(start=t0)
    async with notifier([alertmanager.url], clock=clock, resend_interval=60) as n:
        await n.fire("k", make_alert(name))
        first = alertmanager.alert(name)
        assert first is not None
        clock.advance(30)
        await n.resend()
        again = alertmanager.alert(name)
        assert again is not None
        assert again["fingerprint"] == first["fingerprint"]
        assert ts(again["startsAt"]) == pytest.approx(t0, abs=0.001)
        assert ts(again["endsAt"]) == pytest.approx(t0 + 30 + EXPIRY_FACTOR * 60, abs=0.001)
        assert ts(again["endsAt"]) > ts(first["endsAt"])
        assert sent(registry, alertmanager.url, "delivered") == 2
        await n.resolve("k")


async def test_resolve_ends_the_alert_and_is_idempotent(
    alertmanager: AlertmanagerProcess, notifier: Factory, registry: CollectorRegistry
) -> None:
    name = unique()
    async with notifier([alertmanager.url]) as n:
        await n.fire("k", make_alert(name))
        assert alertmanager.alert(name) is not None
        resolved_before = alertmanager.received("resolved")
        await n.resolve("k")
        # resolved alerts are not listed, whatever the filters
        assert alertmanager.alert(name) is None
        assert alertmanager.alerts(active=False, filter=[f'alertname="{name}"']) == []
        assert alertmanager.received("resolved") == resolved_before + 1
        assert n.state() == []
        assert gauge(registry, "watchd_alerts_firing") == 0
        await n.resolve("k")  # again: nothing sent
        await n.resolve("never-fired")
        assert alertmanager.received("resolved") == resolved_before + 1
        assert sent(registry, alertmanager.url, "delivered") == 2
        # fired again after the resolve: a new alert with a new start
        await asyncio.sleep(0.01)
        t = time.time()
        await n.fire("k", make_alert(name))
        got = alertmanager.alert(name)
        assert got is not None
        assert ts(got["startsAt"]) >= t - 0.002
        await n.resolve("k")


async def test_fire_is_idempotent_per_key(
    alertmanager: AlertmanagerProcess, notifier: Factory, registry: CollectorRegistry
) -> None:
    name = unique()
    clock = FakeClock(start=time.time() - 10)  # behind the Alertmanager's clock even after advance(5)
    t0 = clock.now()
    async with notifier([alertmanager.url], clock=clock) as n:
        await n.fire("k", make_alert(name))
        clock.advance(5)
        await n.fire("k", make_alert(name))  # same alert, already delivered: nothing to send
        assert sent(registry, alertmanager.url, "delivered") == 1
        [got] = alertmanager.alerts(filter=[f'alertname="{name}"'])
        assert ts(got["startsAt"]) == pytest.approx(t0, abs=0.001)

        # new annotations: sent at once, same alert (fingerprint, start) in Alertmanager
        await n.fire("k", make_alert(name, summary="now with more detail"))
        assert sent(registry, alertmanager.url, "delivered") == 2
        [got2] = alertmanager.alerts(filter=[f'alertname="{name}"'])
        assert got2["fingerprint"] == got["fingerprint"]
        assert got2["annotations"] == {"summary": "now with more detail"}
        assert ts(got2["startsAt"]) == pytest.approx(t0, abs=0.001)
        assert n.state()[0]["startsAt"] == rfc3339(t0)

        # new labels under the same key: the old alert is resolved, the new one fires
        moved = Alert(labels={"alertname": name, "node": "gpu-2"}, annotations={"summary": "s"})
        await n.fire("k", moved)
        [got3] = alertmanager.alerts(filter=[f'alertname="{name}"'])
        assert got3["labels"] == {"alertname": name, "node": "gpu-2"}
        assert ts(got3["startsAt"]) == pytest.approx(clock.now(), abs=0.001)
        assert gauge(registry, "watchd_alerts_firing") == 1
        await n.resolve("k")
        assert alertmanager.alerts(filter=[f'alertname="{name}"']) == []


async def test_ha_pair_both_receive(
    alertmanager: AlertmanagerProcess, notifier: Factory, registry: CollectorRegistry
) -> None:
    name = unique()
    with AlertmanagerProcess() as second:
        async with notifier([alertmanager.url, second.url]) as n:
            await n.fire("k", make_alert(name))
            for am in (alertmanager, second):
                got = am.alert(name)
                assert got is not None, am.url
                assert got["labels"]["node"] == "gpu-1"
            assert sent(registry, alertmanager.url, "delivered") == 1
            assert sent(registry, second.url, "delivered") == 1
            assert sorted(n.state()[0]["acked"]) == sorted([alertmanager.url, second.url])
            await n.resolve("k")
            assert alertmanager.alert(name) is None
            assert second.alert(name) is None


async def test_one_alertmanager_down_the_other_still_receives(
    alertmanager: AlertmanagerProcess, notifier: Factory, registry: CollectorRegistry
) -> None:
    name = unique()
    down = f"http://127.0.0.1:{free_port()}"
    async with notifier([down, alertmanager.url], max_attempts=3) as n:
        t = time.monotonic()
        await n.fire("k", make_alert(name))  # must not raise
        assert time.monotonic() - t < 2
        assert alertmanager.alert(name) is not None
        assert sent(registry, alertmanager.url, "delivered") == 1
        assert sent(registry, down, "failed") == 1
        assert gauge(registry, "watchd_alertmanager_up", {"receiver": down}) == 0
        assert gauge(registry, "watchd_alertmanager_up", {"receiver": alertmanager.url}) == 1
        health = {r["url"]: r for r in n.receivers()}
        assert health[down]["up"] is False
        assert "Connect" in health[down]["last_error"]
        assert n.state()[0]["acked"] == [alertmanager.url]
        # not acknowledged everywhere: firing it again tries again (once, the receiver is marked down)
        await n.fire("k", make_alert(name))
        assert sent(registry, down, "failed") == 2
        await n.resolve("k")
        assert alertmanager.alert(name) is None
        assert sent(registry, down, "failed") == 3


@pytest.mark.real
async def test_alertmanager_started_late_gets_the_alert_from_the_resend(
    notifier: Factory, registry: CollectorRegistry
) -> None:
    name = unique()
    late = AlertmanagerProcess(port=free_port())
    try:
        async with notifier([late.url], resend_interval=0.2) as n:
            await n.fire("k", make_alert(name))
            assert sent(registry, late.url, "failed") == 1
            late.start()
            # the process's own start-up is in this wait: generous on a loaded 2-core machine
            await eventually(lambda: late.alert(name) is not None, timeout=20, what="the re-sent alert")
            assert sent(registry, late.url, "delivered") >= 1
            assert gauge(registry, "watchd_alertmanager_up", {"receiver": late.url}) == 1
            got = late.alert(name)
            assert got is not None
            assert ts(got["startsAt"]) == pytest.approx(ts(n.state()[0]["startsAt"]), abs=0.001)
    finally:
        late.stop()


async def test_firing_alerts_live_while_watchd_lives_and_expire_after(
    alertmanager: AlertmanagerProcess, notifier: Factory
) -> None:
    """The dead-man switch: endsAt = now + 4 x resend_interval, pushed forward by every re-send."""
    name = unique()
    interval = 0.25
    async with notifier([alertmanager.url], resend_interval=interval) as n:
        await n.fire("k", make_alert(name))
        first = alertmanager.alert(name)
        assert first is not None
        await asyncio.sleep(EXPIRY_FACTOR * interval + 0.3)  # past the first endsAt: kept by the re-sends
        kept = alertmanager.alert(name)
        assert kept is not None
        assert ts(kept["endsAt"]) > ts(first["endsAt"])
    # watchd gone (the context does not resolve): Alertmanager lets the alert expire
    await eventually(
        lambda: alertmanager.alert(name) is None, timeout=EXPIRY_FACTOR * interval + 2, what="expiry"
    )


# --------------------------------------------------------------------------- error answers
@asynccontextmanager
async def fake_alertmanager(statuses: list[int]) -> AsyncIterator[tuple[str, list[Any]]]:
    """An HTTP server on loopback answering POST /api/v2/alerts with ``statuses`` in turn (then 200)."""
    bodies: list[Any] = []

    async def handle(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        status = statuses.pop(0) if statuses else 200
        return web.Response(status=status, text="" if status == 200 else f"status {status}")

    app = web.Application()
    app.router.add_post("/api/v2/alerts", handle)
    async with serve(app, "127.0.0.1", 0) as port:
        yield f"http://127.0.0.1:{port}", bodies


async def test_bad_request_is_not_retried(notifier: Factory, registry: CollectorRegistry) -> None:
    async with fake_alertmanager([400]) as (url, bodies), notifier([url]) as n:
        await n.fire("k", make_alert("X"))
        assert len(bodies) == 1
        assert sent(registry, url, "rejected") == 1
        # a rejection says nothing about the Alertmanager's health
        assert gauge(registry, "watchd_alertmanager_up", {"receiver": url}) == 1
        assert n.state()[0]["acked"] == []


async def test_server_errors_are_retried_then_counted(notifier: Factory, registry: CollectorRegistry) -> None:
    async with fake_alertmanager([503, 500]) as (url, bodies), notifier([url], max_attempts=3) as n:
        await n.fire("k", make_alert("X"))
        assert len(bodies) == 3
        assert sent(registry, url, "delivered") == 1
        [payload] = bodies[-1]
        assert set(payload) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
    async with fake_alertmanager([500, 500, 500]) as (url, bodies):
        reg2 = CollectorRegistry()
        async with AlertmanagerNotifier([url], registry=reg2, max_attempts=3, backoff=0.01) as n2:
            await n2.fire("k", make_alert("X"))
            assert len(bodies) == 3
            assert sent(reg2, url, "failed") == 1
            await n2.resolve("k")  # marked down: a single attempt
            assert len(bodies) == 4
            assert sent(reg2, url, "delivered") == 1
            assert gauge(reg2, "watchd_alertmanager_up", {"receiver": url}) == 1


async def test_resend_never_overtakes_a_resolve(notifier: Factory) -> None:
    """Posts to one Alertmanager are serialized and each batch is built when its turn comes."""
    gate = asyncio.Event()
    bodies: list[Any] = []

    async def handle(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        if len(bodies) == 3:
            await gate.wait()  # hold the re-send in flight
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/api/v2/alerts", handle)
    async with serve(app, "127.0.0.1", 0) as port, notifier([f"http://127.0.0.1:{port}"]) as n:
        await n.fire("a", make_alert("A"))
        await n.fire("b", make_alert("B"))
        resend = asyncio.create_task(n.resend())
        await eventually(lambda: len(bodies) == 3, what="the re-send in flight")
        resolve = asyncio.create_task(n.resolve("a"))
        await asyncio.sleep(0.05)
        assert len(bodies) == 3  # the resolve waits for the re-send
        gate.set()
        await asyncio.wait_for(asyncio.gather(resend, resolve), 5)
    last = bodies[-1]
    assert [a["labels"]["alertname"] for a in last] == ["A"]
    assert ts(last[0]["endsAt"]) <= time.time()


def test_clock_defaults_to_system_clock() -> None:
    n = AlertmanagerNotifier(["http://127.0.0.1:1/"], registry=CollectorRegistry())
    assert isinstance(n.clock, SystemClock)
    assert n.receivers()[0]["url"] == "http://127.0.0.1:1"
    with pytest.raises(ValueError):
        AlertmanagerNotifier([], registry=CollectorRegistry())
