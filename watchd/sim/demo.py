"""``watchd demo``: an engine and a simulated fleet on loopback, a GPU falling off the bus, narrated.

Everything is real but the GPUs and the scheduler: the fleet simulator (fake GPUs under training load, the
fake driver's kernel lines through the real Xid parser, health events and summaries) ships over real HTTP to
a real engine with the default rule pack. The engine runs in dry-run mode, as the shipped config does.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import AsyncExitStack
from typing import Any, TextIO

import aiohttp

from watchd.config import EngineConfig
from watchd.credentials import EngineAuth
from watchd.engine.runner import Engine
from watchd.http_settings import Listen
from watchd.logs import configure_logging
from watchd.model.events import Event
from watchd.sim.fleet import parse_fleet
from watchd.sim.simulator import Simulator

SICK_GPU = 3
FALL_AT_S = 2.0
APP_XID_AT_S = 4.0


async def _actions(session: aiohttp.ClientSession, url: str, node: str) -> list[dict[str, Any]]:
    async with session.get(f"{url}/api/v1/actions", params={"limit": "10000"}) as resp:
        body = await resp.json()
    return [a for a in body["actions"] if a["node"] == node]


async def _wait_for(
    session: aiohttp.ClientSession, url: str, node: str, kinds: set[str], timeout: float = 15.0
) -> tuple[list[dict[str, Any]], float]:
    """The node's actions once those of ``kinds`` are all there, and when that was (wall clock)."""
    deadline = time.monotonic() + timeout
    while True:
        actions = await _actions(session, url, node)
        if kinds <= {a["action"] for a in actions} or time.monotonic() > deadline:
            done = time.time()
            await asyncio.sleep(0.3)  # let the rest of this event's decisions land
            return await _actions(session, url, node), done
        await asyncio.sleep(0.002)


async def _first(events: list[Event], match: Any, timeout: float = 15.0) -> Event | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in events:
            if match(event):
                return event
        await asyncio.sleep(0.005)
    return None


async def run_demo(nodes: int, out: TextIO) -> int:
    configure_logging("error", "console")  # the narration is the output; daemons log only errors
    token = secrets.token_hex(16)
    names = [f"gpu-node-{i}" for i in range(1, nodes + 1)]
    sick, other = names[min(2, nodes - 1)], names[0]

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    fleet = parse_fleet(
        {
            "seed": 1,
            "nodes": {"count": nodes, "name": "gpu-node-{i}", "start": 1},
            "gpus": {"model": "H100-SXM", "count": 8},
            "interval_s": 0.5,
            "summary_window_s": 5,
            "jobs": [{"id": 4242, "nodes": names}],
            "faults": [
                {"node": sick, "kind": "fall_off_bus", "at": FALL_AT_S, "gpu": SICK_GPU},
                *(
                    [{"node": other, "kind": "xid", "code": 13, "at": APP_XID_AT_S, "gpu": 1}]
                    if other != sick
                    else []
                ),
            ],
        },
        "<demo fleet>",
    )
    engine_config = EngineConfig(
        listen=Listen(host="127.0.0.1", port=0),
        auth=EngineAuth(token=token),
        mode="dry-run",
        slurm={"enabled": False},  # type: ignore[arg-type]
    )
    produced: list[Event] = []
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(Engine(engine_config, use_config_scheduler=False))
        url = f"http://127.0.0.1:{engine.port}"
        session = await stack.enter_async_context(
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"})
        )
        say(
            f"watchd demo: engine on {url} in dry-run mode with the default rules ({len(engine.rules.names)})"
        )
        say(f"            {nodes} simulated nodes x 8 GPUs training job 4242, each shipping like an agent")
        say(f"            in {FALL_AT_S:g} s, GPU {SICK_GPU} of {sick} falls off the bus")
        say()
        await stack.enter_async_context(
            Simulator(fleet, url, token, tap=produced.append, shutdown_flush_s=1.0)
        )

        xid = await _first(produced, lambda e: e.kind == "xid" and e.node == sick)
        if xid is None:
            say("the fault never showed: something is wrong")
            return 1
        say(f"[{sick}] kernel: {xid.attrs.get('raw')}")
        actions, done = await _wait_for(session, url, sick, {"drain", "requeue"})
        actions = [a for a in actions if a["event_id"] == xid.id]
        drain = next((a for a in actions if a["action"] == "drain"), None)
        if drain is None:
            say("the engine did not decide within 15 s: something is wrong")
            return 1
        say(f"  event     Xid {xid.attrs['xid']} on GPU {xid.attrs['pci_bus_id']}: {xid.attrs['meaning']}")
        say(f"  rule      {drain['rule']} matched")
        for a in actions:
            say(f"  decision  {a['action']:<8} {a['node']}  {a['rule']:<24} -> {a['outcome']}: {a['detail']}")
        say(f"  latency   kernel line to drain and requeue decided: {(done - xid.time) * 1000:.1f} ms")
        if any(a["outcome"] == "no_alertmanager" for a in actions):
            say("            (alerts go to Alertmanager once alertmanager.urls is set)")
        lost = await _first(
            produced,
            lambda e: e.kind == "gpu_health" and e.node == sick and e.attrs.get("condition") == "gpu_lost",
        )
        if lost is not None:
            say(f"  telemetry NVML reports GPU {lost.attrs['gpu']} lost too ({lost.attrs['evidence']}):")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                by_lost = [a for a in await _actions(session, url, sick) if a["rule"] == "gpu-lost"]
                if len(by_lost) >= 3:
                    break
                await asyncio.sleep(0.01)
            for a in by_lost:
                say(f"  decision  {a['action']:<8} {a['node']}  {a['rule']:<24} -> {a['outcome']}")
        say()

        if other != sick:
            app = await _first(produced, lambda e: e.kind == "xid" and e.node == other)
            if app is not None:
                say(f"[{other}] kernel: {app.attrs.get('raw')}")
                actions, _ = await _wait_for(session, url, other, {"log"})
                for a in actions:
                    say(f"  decision  {a['action']:<8} {a['node']}  -> {a['outcome']}: {a['detail']}")
                say("            an application Xid is recorded, not drained: the job is at fault")
                say()
        await _first(produced, lambda e: e.kind == "gpu_summary")
        summaries = sum(1 for e in produced if e.kind == "gpu_summary")
        say(f"meanwhile the fleet sent {summaries} GPU summaries (one per GPU per 5 s window, with the job)")
        untouched = [n for n in names if n not in (sick, other)]
        say(f"nodes without faults were left alone: {', '.join(untouched) or '(none)'}")
        say("in enforce mode the drain goes to Slurm: scontrol update NodeName=... State=DRAIN Reason=...")
    say()
    from watchd.sim.demo_loop import run_loop_act  # hang -> culprit -> requeue onto a spare

    return await run_loop_act(say)
