"""Reboots on Kubernetes: watchd asks, the site's reboot daemon acts. Kubernetes has no reboot verb; sites run
a daemon that reboots nodes (kured, a vendor's node agent) and a way to ask it. watchd writes its request in
the node annotation ``watchd.io/reboot-requested`` — the reason and the node's ``bootID`` when it asked —
for that daemon to act on (a kured sentinel command can test for it). A reboot is pending while the annotation
names the node's current ``bootID``; once the node reports a new one, the reboot is over."""

from __future__ import annotations

import json
import time
from typing import Any

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node  # imported after the scheduler checked the extra
from lightkube.types import PatchType

from watchd.integrations.kubernetes.client import API_ERRORS, describe_error
from watchd.model.nodes import RebootResult

REBOOT_ANNOTATION = "watchd.io/reboot-requested"


def boot_id_of(node: Node) -> str | None:
    info = node.status.nodeInfo if node.status is not None else None
    return info.bootID if info is not None and info.bootID else None


def reboot_flags(node: Node) -> frozenset[str]:
    """``REBOOT_REQUESTED`` while watchd's request names the node's current boot."""
    return frozenset({"REBOOT_REQUESTED"}) if reboot_pending(node) else frozenset()


def reboot_pending(node: Node) -> bool:
    """watchd asked for a reboot and the node still runs the boot it asked in."""
    raw = ((node.metadata or ObjectMeta()).annotations or {}).get(REBOOT_ANNOTATION)
    try:
        asked: Any = json.loads(raw) if raw else None
    except ValueError:
        return False
    return isinstance(asked, dict) and asked.get("boot_id") == boot_id_of(node)


async def ask_reboot(client: AsyncClient, node: Node, reason: str) -> RebootResult:
    """Write watchd's request on ``node`` (a node watchd cordoned), unless one for its current boot is
    there already."""
    name = (node.metadata or ObjectMeta()).name or ""
    if reboot_pending(node):
        return RebootResult(name, "rebooting", "a reboot is pending already", boot_id_of(node))
    value = json.dumps({"reason": reason, "boot_id": boot_id_of(node), "time": time.time()})
    patch = {"metadata": {"annotations": {REBOOT_ANNOTATION: value}}}
    try:
        await client.patch(Node, name, patch, patch_type=PatchType.MERGE)
    except API_ERRORS as exc:
        return RebootResult(name, "failed", describe_error(f"PATCH nodes/{name}", exc))
    return RebootResult(name, "rebooting", f"{REBOOT_ANNOTATION} set: {reason}", boot_id_of(node))
