"""The engine's ingest API over real HTTP on loopback."""

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.support import eventually, scheduler_actions, xid_event
from watchd.config import EngineConfig, IngestConfig
from watchd.credentials import TokenSource
from watchd.engine.runner import Engine
from watchd.http_settings import HttpConfig, Listen
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.events import INGEST_PATH, batch_to_wire

TOKEN = "t0ken"


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    config = EngineConfig(
        listen=Listen(port=0),
        auth=TokenSource(token=TOKEN),
        mode="enforce",
        ingest=IngestConfig(max_body_bytes=64 * 1024, max_events_per_batch=100),
    )
    fake = FakeScheduler()
    fake.add_nodes(["gpu-1", "gpu-2"])
    async with Engine(config, scheduler=fake) as e:
        yield e


async def post(engine: Engine, body: bytes | str, token: str | None = TOKEN) -> tuple[int, dict[str, object]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = body.encode() if isinstance(body, str) else body
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{engine.port}{INGEST_PATH}", data=data, headers=headers) as r,
    ):
        return r.status, await r.json()


def batch(*events: object) -> str:
    return json.dumps(batch_to_wire("gpu-1", list(events)))  # type: ignore[arg-type]


def rejected(engine: Engine, reason: str) -> float:
    return engine.metrics.ingest_rejected.labels(reason)._value.get()


async def test_accepts_and_acts(engine: Engine) -> None:
    status, body = await post(engine, batch(xid_event("gpu-1")))
    assert status == 200 and body == {"accepted": 1, "duplicates": 0}
    # acknowledged only once evaluated: the drain is already recorded (a crash now would re-drive it)
    assert [i.rule for i in engine.store.intents.under("drain:gpu-1")] == ["xid-fatal-hardware"]
    assert engine.metrics.ingest_ack_timeouts._value.get() == 0
    await eventually(lambda: len(scheduler_actions(engine.audit.entries)) == 2, what="drain and requeue")
    assert engine.scheduler.nodes["gpu-1"].drained  # type: ignore[union-attr]


@pytest.mark.parametrize("token", [None, "wrong", ""])
async def test_unauthorized(engine: Engine, token: str | None) -> None:
    status, body = await post(engine, batch(xid_event()), token=token)
    assert status == 401 and "token" in str(body["error"])
    assert engine.queue.empty() and not engine.audit.entries
    assert rejected(engine, "unauthorized") == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{not json", "malformed JSON"),
        (b"\xff\xfe\x00", "malformed JSON"),
        ("[]", "expected a JSON object"),
        ('{"version": 2, "events": []}', "version: expected 1"),
        ('{"version": 1, "events": {}}', "events: expected a list"),
        ('{"version": 1, "events": [{"id": "a"}]}', "events[0]"),
        (
            '{"version": 1, "events": [{"id": "a", "node": "n", "source": "s", "kind": "k", "time": "now"}]}',
            "events[0].time",
        ),
        (
            '{"version": 1, "events": [{"id": "a", "node": "n", "source": "s", "kind": "k", "time": 1, '
            '"attrs": {"x": [1]}}]}',
            "events[0].attrs.x",
        ),
        (
            '{"version": 1, "events": [{"id": "a", "node": "n", "source": "s", "kind": "k", "time": 1, '
            '"extra": 1}]}',
            "unknown keys",
        ),
    ],
)
async def test_malformed_and_wrong_schema_get_400_with_reason(
    engine: Engine, body: str | bytes, message: str
) -> None:
    status, reply = await post(engine, body)
    assert status == 400
    assert message in str(reply["error"])
    assert engine.queue.empty()


async def test_too_many_events_in_one_batch(engine: Engine) -> None:
    events = [xid_event(event_id=f"e{i}") for i in range(101)]
    status, reply = await post(engine, batch(*events))
    assert status == 400 and "at most 100" in str(reply["error"])


async def test_oversized_body_gets_413_and_server_keeps_serving(engine: Engine) -> None:
    status, reply = await post(engine, "x" * (65 * 1024))
    assert status == 413 and "larger than" in str(reply["error"])
    status, _ = await post(engine, batch(xid_event()))
    assert status == 200


async def test_duplicates_are_counted_not_acted_on_twice(engine: Engine) -> None:
    event = xid_event("gpu-2", event_id="same")
    assert (await post(engine, batch(event, event)))[1] == {"accepted": 1, "duplicates": 1}
    assert (await post(engine, batch(event)))[1] == {"accepted": 0, "duplicates": 1}
    await eventually(lambda: len(scheduler_actions(engine.audit.entries)) == 2, what="one decision")
    await asyncio.sleep(0.1)
    assert len(scheduler_actions(engine.audit.entries)) == 2
    assert engine.metrics.events_duplicate._value.get() == 2


async def test_slow_client_does_not_stall_others(engine: Engine) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", engine.port)
    writer.write(
        f"POST {INGEST_PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"version"'.encode()
    )
    await writer.drain()
    status, _ = await asyncio.wait_for(post(engine, batch(xid_event())), timeout=5)
    assert status == 200
    writer.close()


async def test_metrics_and_health_endpoints(engine: Engine) -> None:
    await post(engine, batch(xid_event()))
    await eventually(lambda: len(scheduler_actions(engine.audit.entries)) == 2, what="actions")
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:  # reads: issue 22
        async with s.get(f"http://127.0.0.1:{engine.port}/metrics") as r:
            text = await r.text()
        async with s.get(f"http://127.0.0.1:{engine.port}/healthz") as r:
            assert r.status == 200
        async with s.get(f"http://127.0.0.1:{engine.port}/api/v1/actions") as r:
            actions = (await r.json())["actions"]
    assert 'watchd_actions_total{action="drain",mode="enforce",outcome="drained"} 1.0' in text
    assert 'watchd_events_received_total{kind="xid",source="kmsg"} 1.0' in text
    # no checks on this engine: nothing would validate the node after a reboot, so none is asked for
    assert [(a["action"], a["outcome"]) for a in actions][-1] == ("reboot", "no_checks")
    assert [a["action"] for a in actions] == ["drain", "requeue", "reboot"]


async def test_a_batch_larger_than_the_whole_queue_gets_413_so_the_agent_splits_it() -> None:
    config = EngineConfig(
        listen=Listen(port=0), auth=TokenSource(token=TOKEN), ingest=IngestConfig(queue_size=2)
    )
    async with Engine(config, use_config_scheduler=False) as engine:
        events = [xid_event(event_id=f"q{i}") for i in range(3)]
        status, reply = await post(engine, batch(*events))
        assert status == 413 and "queue" in str(reply["error"])
        # nothing of the refused batch was taken in, so its events are not duplicates when re-sent
        status, reply = await post(engine, batch(*events[:2]))
        assert status == 200 and reply == {"accepted": 2, "duplicates": 0}


async def test_a_large_batch_arriving_in_many_chunks_is_read_whole() -> None:
    # the client writes the body on the engine's own event loop: on a loaded machine that can take longer
    # than the default 5 s body deadline, which this test is not about (tests/engine/test_http_errors.py is)
    config = EngineConfig(
        listen=Listen(port=0),
        auth=TokenSource(token=TOKEN),
        ingest=IngestConfig(max_body_bytes=8 * 1024 * 1024, max_events_per_batch=10_000),
        http=HttpConfig(body_timeout_s=120),
    )
    async with Engine(config, use_config_scheduler=False) as engine:
        events = [xid_event(event_id=f"big{i}", message="x" * 200) for i in range(3000)]
        body = batch(*events)
        assert len(body) > 1_000_000
        status, reply = await post(engine, body)
        assert status == 200 and reply == {"accepted": 3000, "duplicates": 0}


async def test_an_event_from_the_future_takes_its_arrival_time_and_still_acts_and_unknown_kinds_get_no_label(
    engine: Engine,
) -> None:
    import time as _time

    from watchd.model.events import Event

    ahead = _time.time() + 3600
    future = Event(id="f", node="gpu-1", source="kmsg", kind="xid", time=ahead, attrs={"xid": 79})
    status, reply = await post(engine, batch(future))
    assert status == 200 and reply == {"accepted": 1, "duplicates": 0}
    assert engine.metrics.events_restamped.labels("kmsg")._value.get() == 1
    await eventually(lambda: len(scheduler_actions(engine.audit.entries)) == 2, what="drain and requeue")
    assert scheduler_actions(engine.audit.entries)[0].node == "gpu-1"
    odd = Event(id="o", node="gpu-1", source="made-up-source", kind="kind-of-the-day", time=_time.time())
    assert (await post(engine, batch(odd)))[0] == 200
    assert engine.metrics.events_received.labels("other", "other")._value.get() == 1


async def test_a_broken_event_is_set_aside_and_its_batch_neighbours_are_kept(engine: Engine) -> None:
    good = [xid_event("gpu-1", event_id="g1").to_wire(), xid_event("gpu-2", event_id="g2").to_wire()]
    broken = {**good[0], "id": "b", "time": "yesterday"}
    body = json.dumps({"version": 1, "node": "gpu-1", "events": [good[0], broken, good[1]]})
    status, reply = await post(engine, body)
    assert status == 200 and reply["accepted"] == 2
    assert reply["invalid"] == [{"index": 1, "error": "events[1].time: expected seconds since the epoch"}]
    assert engine.metrics.events_invalid._value.get() == 1
    await eventually(lambda: len(scheduler_actions(engine.audit.entries)) == 4, what="both nodes acted on")
    assert {a.node for a in scheduler_actions(engine.audit.entries)} == {"gpu-1", "gpu-2"}


def test_restamping_keeps_the_nodes_time_and_leaves_sane_events_alone() -> None:
    from dataclasses import replace

    from watchd.engine.metrics import EngineMetrics
    from watchd.engine.server import restamp_future

    now = 1_000_000.0
    sane = [replace(xid_event(event_id="s"), time=now + 299)]
    assert restamp_future(sane, now, EngineMetrics()) is sane
    ahead = replace(xid_event(event_id="a"), time=now + 3600)
    [fixed] = restamp_future([ahead], now, EngineMetrics())
    assert fixed.time == now and fixed.attrs["node_time"] == now + 3600 and fixed.id == "a"


async def test_the_same_application_xid_in_two_jobs_on_one_gpu_drains_it(engine: Engine) -> None:
    """Kernel Xid lines carry no job: the engine takes it from the GPU's summaries, so the pack's
    app-xid-repeated rule (3 times in 24 h across at least 2 jobs) fires on what agents really send."""
    import time

    from watchd.model.events import Event

    def summary(job: str, t: float) -> Event:
        attrs = {"gpu": 0, "pci_bus_id": "00000000:3B:00.0", "uuid": "GPU-0", "model": "H100", "job": job}
        return Event(id=f"s-{job}", node="gpu-1", source="nvml", kind="gpu_summary", time=t, attrs=attrs)  # type: ignore[arg-type]

    def app_xid(n: int) -> Event:
        e = xid_event(
            "gpu-1", 13, event_id=f"x{n}", meaning="Graphics Engine Exception", bucket="RESTART_APP"
        )
        assert "job" not in e.attrs
        return e

    now = time.time()
    for body in (
        batch(summary("1001", now), app_xid(1), app_xid(2)),
        batch(summary("1002", now + 5), app_xid(3)),
    ):
        assert (await post(engine, body))[0] == 200
    await eventually(
        lambda: any(a.rule == "app-xid-repeated" and a.action == "drain" for a in engine.audit.entries),
        what="app-xid-repeated drain",
    )
    assert engine.scheduler.nodes["gpu-1"].drained  # type: ignore[union-attr]


async def test_status_lists_nodes_recent_actions_and_prints_them(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import time

    from watchd.model.events import Event
    from watchd.operator_cli import run_status
    from watchd.reach import connect

    now = time.time()
    summary = Event(
        id="s1",
        node="gpu-2",
        source="nvml",
        kind="gpu_summary",
        time=now,
        attrs={"gpu": 0, "pci_bus_id": "0000:3b:00.0", "uuid": "GPU-0", "model": "H100", "job": "42"},
    )
    assert (await post(engine, json.dumps(batch_to_wire("gpu-2", [summary]))))[0] == 200
    assert (await post(engine, batch(xid_event("gpu-1", 79, bucket="RESTART_BM"))))[0] == 200
    await eventually(lambda: len(scheduler_actions(engine.audit.entries)) == 2, what="drain and requeue")
    nodes = {n["node"]: n for n in engine.status()["nodes"]}
    assert nodes["gpu-2"]["gpus"] == 1 and nodes["gpu-2"]["jobs"] == ["slurm:42"]
    assert nodes["gpu-2"]["recent_faults"] == 0 and nodes["gpu-2"]["last_action"] is None
    assert nodes["gpu-1"]["recent_faults"] == 1 and nodes["gpu-1"]["last_fault"].startswith("xid 79")
    assert nodes["gpu-1"]["last_action"]["action"] in ("drain", "requeue")
    out = io.StringIO()
    monkeypatch.setenv("WATCHD_TOKEN", TOKEN)  # reads need a credential (issue 22)
    assert await asyncio.to_thread(run_status, connect(f"http://127.0.0.1:{engine.port}"), False, out) == 0
    text = out.getvalue()
    assert "nodes: 2 reporting; 1 with faults (24 h), lost GPUs or held actions:" in text
    assert "gpu-1            0 GPUs, jobs -, 1 faults (last: xid 79" in text
    assert "recent actions (last " in text and " drain    gpu-1            drained" in text


async def test_status_cli_pages_and_filters_nodes(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import time

    from watchd.model.events import Event
    from watchd.operator_cli import run_status
    from watchd.reach import connect

    now = time.time()
    summaries = [
        Event(id=f"s{i}", node=f"gpu-{i}", source="nvml", kind="gpu_summary", time=now, attrs={"gpu": 0})
        for i in range(3, 8)
    ]
    assert (await post(engine, json.dumps(batch_to_wire("gpu-3", summaries))))[0] == 200
    await eventually(lambda: engine.status()["nodes_total"] == 5, what="five nodes")
    url = f"http://127.0.0.1:{engine.port}"
    out = io.StringIO()
    monkeypatch.setenv("WATCHD_TOKEN", TOKEN)  # reads need a credential (issue 22)
    assert await asyncio.to_thread(run_status, connect(url), False, out, limit=2) == 0
    assert "nodes: 5 reporting (2 shown, troubled first); 0 with faults" in out.getvalue()
    raw = io.StringIO()
    assert await asyncio.to_thread(run_status, connect(url), True, raw, node="gpu-6") == 0
    doc = json.loads(raw.getvalue())
    assert [n["node"] for n in doc["nodes"]] == ["gpu-6"] and doc["nodes_total"] == 1
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s,
        s.get(f"{url}/api/v1/status?limit=x") as r,
    ):
        assert r.status == 400 and "limit" in (await r.json())["error"]
