"""``watchd demo``: an engine and simulated nodes on loopback, an Xid 79 on one of them, narrated.

Everything is real but the GPUs and the scheduler: real HTTP between agents and engine, the real parser,
rules and executor. The engine runs in dry-run mode, as the shipped config does.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import AsyncExitStack
from typing import Any, TextIO

import aiohttp

from watchd.agent.runner import Agent
from watchd.config import AgentConfig, EngineConfig, EngineEndpoint, Listen, SourcesConfig, TokenSource
from watchd.engine.runner import Engine
from watchd.logs import configure_logging
from watchd.sources.base import FakeLogSource

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python3, GPU has fallen off the bus."
XID_13 = (
    "NVRM: Xid (PCI:0000:1a:00): 13, pid=7781, name=python3, Graphics SM Warp Exception on "
    "(GPC 0, TPC 1, SM 0): Out Of Range Address"
)


async def _actions(session: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    async with session.get(f"{url}/api/v1/actions", params={"limit": "1000"}) as resp:
        body = await resp.json()
    actions: list[dict[str, Any]] = body["actions"]
    return actions


async def _wait_for(
    session: aiohttp.ClientSession, url: str, node: str, kinds: set[str], timeout: float = 10.0
) -> tuple[list[dict[str, Any]], float]:
    """The node's actions once those of ``kinds`` are all there, and when that was (monotonic)."""
    deadline = time.monotonic() + timeout
    while True:
        actions = [a for a in await _actions(session, url) if a["node"] == node]
        if kinds <= {a["action"] for a in actions} or time.monotonic() > deadline:
            done = time.monotonic()
            await asyncio.sleep(0.1)  # let the rest of this event's decisions land
            return [a for a in await _actions(session, url) if a["node"] == node], done
        await asyncio.sleep(0.002)


async def run_demo(nodes: int, out: TextIO) -> int:
    configure_logging("error", "console")  # the narration is the output; daemons log only errors
    token = secrets.token_hex(16)
    names = [f"gpu-node-{i}" for i in range(1, nodes + 1)]
    sick = names[min(2, nodes - 1)]

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    engine_config = EngineConfig(
        listen=Listen(host="127.0.0.1", port=0), auth=TokenSource(token=token), mode="dry-run"
    )
    sources = {name: FakeLogSource(name="kmsg") for name in names}
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(Engine(engine_config, use_config_scheduler=False))
        url = f"http://127.0.0.1:{engine.port}"
        for name in names:
            config = AgentConfig(
                node=name,
                engine=EngineEndpoint(url=url, auth=TokenSource(token=token)),
                listen=Listen(host="127.0.0.1", port=0),
                sources=SourcesConfig(),
            )
            await stack.enter_async_context(Agent(config, sources=[sources[name]]))
        session = await stack.enter_async_context(aiohttp.ClientSession())

        say(
            f"watchd demo: engine on {url} in dry-run mode with the default rules ({len(engine.rules.names)})"
        )
        say(f"            {nodes} simulated nodes, each with an agent shipping over HTTP: {', '.join(names)}")
        say()

        start = time.monotonic()
        say(f"[{sick}] kernel: {XID_79}")
        sources[sick].inject_log(XID_79)
        actions, done = await _wait_for(session, url, sick, {"drain", "requeue"})
        elapsed = done - start
        drain = next((a for a in actions if a["action"] == "drain"), None)
        if drain is None:
            say("the engine did not decide within 10 s: something is wrong (see the log above)")
            return 1
        say(f"  event     {drain['params']['reason']} on {drain['node']}, received by the engine")
        say(f"  rule      {drain['rule']} matched (severity critical)")
        for a in actions:
            say(f"  decision  {a['action']:<8} {a['node']}  -> {a['outcome']}: {a['detail']}")
        say(f"  latency   kernel line to drain and requeue decided: {elapsed * 1000:.1f} ms")
        if any(a["outcome"] == "no_alertmanager" for a in actions):
            say("            (alerts go to Alertmanager once alertmanager.urls is set)")
        say()

        other = names[0]
        say(f"[{other}] kernel: {XID_13}")
        sources[other].inject_log(XID_13)
        actions, _ = await _wait_for(session, url, other, {"log"})
        for a in actions:
            say(f"  decision  {a['action']:<8} {a['node']}  -> {a['outcome']}: {a['detail']}")
        say("            an application Xid is recorded, not drained: the job, not the GPU, is at fault")
        say()
        untouched = [n for n in names if n not in (sick, other)]
        say(f"nodes without faults were left alone: {', '.join(untouched) or '(none)'}")
        say("in enforce mode the drain goes to Slurm: scontrol update NodeName=... State=DRAIN Reason=...")
    return 0
