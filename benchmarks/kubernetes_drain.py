"""Kubernetes drain: decision -> node cordoned and tainted, one node and a 150-node burst, through the real
client (lightkube, no client-side rate limiter; the adapter's default max_concurrency 16) against the
in-process API server on loopback. Floor: one raw PATCH round trip with the same client.

The in-process server is one Python process answering on loopback: the figures measure watchd's and the
client's overhead, not a real API server's (etcd writes, admission, network)."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from tests.harness.kube_api import KubeApiServer
from watchd.integrations.kubernetes.client import make_client
from watchd.integrations.kubernetes.scheduler import KubernetesScheduler

ROUNDS = 50
BURST = 150


async def main() -> None:
    async with KubeApiServer() as api:
        for i in range(BURST + ROUNDS + 1):
            api.add_node(f"gpu-{i}")
        with tempfile.TemporaryDirectory() as tmp:
            kc = Path(tmp) / "kubeconfig"
            kc.write_text(yaml.safe_dump(api.kubeconfig()))
            client = make_client(kc, in_cluster=False)
            sched = KubernetesScheduler(client)
            await client.get(Node, "gpu-0")  # connection warm
            floor = []
            for _ in range(ROUNDS):
                t = time.perf_counter()
                await client.patch(
                    Node, "gpu-0", {"metadata": {"labels": {"x": str(t)}}}, patch_type=PatchType.MERGE
                )
                floor.append(time.perf_counter() - t)
            one = []
            for i in range(ROUNDS):
                node = f"gpu-{BURST + 1 + i}"
                t = time.perf_counter()
                res = await sched.drain({node: "Xid 79"})  # reads the state, decides, patches
                one.append(time.perf_counter() - t)
                assert res[node].outcome == "drained"
            burst_nodes = {f"gpu-{i}": "Xid 79" for i in range(1, BURST + 1)}
            t = time.perf_counter()
            res = await sched.drain(burst_nodes)
            burst = time.perf_counter() - t
            assert all(r.outcome == "drained" for r in res.values())
            assert all(api.node(n)["spec"].get("unschedulable") for n in burst_nodes)
            await sched.wait_evictions()
            await sched.aclose()
    f50, o50 = statistics.median(floor), statistics.median(one)
    o99 = sorted(one)[int(0.99 * (len(one) - 1))]
    print(f"floor: raw PATCH round trip       p50 {f50 * 1e3:7.2f} ms")
    print(
        f"one node: decision -> cordoned    p50 {o50 * 1e3:7.2f} ms  p99 {o99 * 1e3:7.2f} ms  "
        f"({o50 / f50:.1f}x floor: a GET and a PATCH)"
    )
    print(
        f"{BURST}-node burst: all cordoned+tainted {burst * 1e3:7.1f} ms  "
        f"({burst / BURST * 1e3:.2f} ms/node, {burst / f50 / BURST:.2f}x floor per node)"
    )


if __name__ == "__main__":
    asyncio.run(main())
