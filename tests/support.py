"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from watchd.model.events import Event

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def xid_event(node: str = "gpu-1", code: int = 79, event_id: str = "e1", **attrs: object) -> Event:
    base: dict[str, object] = {
        "xid": code,
        "pci_bus_id": "0000:3b:00.0",
        "meaning": "GPU has fallen off the bus",
    }
    base.update(attrs)
    return Event(id=event_id, node=node, source="kmsg", kind="xid", time=time.time(), attrs=base)  # type: ignore[arg-type]


async def eventually(check: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def real_components_required() -> bool:
    """Under CI (or WATCHD_REQUIRE_SLURM=1) a missing real component is a failure, never a skip."""
    return bool(os.environ.get("CI")) or os.environ.get("WATCHD_REQUIRE_SLURM") == "1"


def scheduler_actions(entries: Iterable[Any]) -> list[Any]:
    """The audit records of drains and requeues (the rule pack may add alerts and logs around them)."""
    return [a for a in entries if (a["action"] if isinstance(a, dict) else a.action) in ("drain", "requeue")]


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``check`` (blocking) until it returns something true; that value. For tests of real processes."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class ScriptedLease:
    """A leadership as the database lease answers it: ``leading`` is what the engine believes between
    renewals; the authority confirms the first ``confirms`` questions (the pipeline's leadership stage asks
    once, each fenced call once more), then says no: the lease was taken meanwhile."""

    holder = "engine-b"
    takeover_wait_s = 0.0

    def __init__(self, leading: bool, confirms: int) -> None:
        self.leading = leading
        self.confirms = confirms

    async def wait_leader(self, timeout: float) -> bool:
        return self.leading

    async def confirm(self) -> bool:
        self.confirms -= 1
        return self.confirms >= 0
