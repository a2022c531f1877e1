"""A GPU in MIG mode, end to end: kernel records read by the agent's real /dev/kmsg reader (a SOCK_SEQPACKET
pair, one record per read), shipped over HTTP to a real engine, where the pack and a rule on the MIG
instance act on them."""

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.test_agent import agent_config, engine_config
from tests.support import eventually, scheduler_actions
from watchd.agent.runner import Agent
from watchd.engine.runner import Engine
from watchd.sources.kmsg import KmsgSource

#: What the driver prints for a contained ECC error in a GPU instance, and for one attributed to a
#: compute instance too (NVIDIA's A100 memory error management guide; kernel_rc.c).
MIG_94 = (
    "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No"
)
MIG_95 = "NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:02): 95, pid=7201, name=python3, Uncontained: SM (0x1)."

MIG_RULE = """
rules:
  - name: mig-instance-xid
    description: a site's rule on the MIG instance of an Xid
    severity: warning
    match: {kind: xid, gpu_instance: {exists: true}}
    group_by: [node, pci_bus_id, gpu_instance, compute_instance]
    actions:
      - alert:
          summary: "Xid {{ xid }} GPU {{ pci_bus_id }} GI {{ gpu_instance }} CI {{ compute_instance }}"
"""


def kernel_record(seq: int, message: str) -> bytes:
    return f"3,{seq},{seq * 1000},-;{message}\n".encode()  # facility 0: the kernel's own


@pytest.fixture
def kmsg() -> Iterator[tuple[socket.socket, KmsgSource]]:
    writer, reader = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reader.setblocking(False)
    yield writer, KmsgSource(opener=lambda: os.dup(reader.fileno()), boot_id="b1")
    writer.close()
    reader.close()


async def test_mig_xids_from_kmsg_reach_the_engine_with_their_instances(
    kmsg: tuple[socket.socket, KmsgSource], tmp_path: Path
) -> None:
    writer, source = kmsg
    rules = tmp_path / "mig.yaml"
    rules.write_text(MIG_RULE)
    config = engine_config(0).model_copy(update={"rules": [rules]})
    async with Engine(config, use_config_scheduler=False) as engine:
        async with Agent(agent_config(engine.port), sources=[source]) as agent:
            writer.send(kernel_record(1, MIG_94))
            writer.send(kernel_record(2, MIG_95))
            await eventually(
                lambda: len([e for e in engine.audit.entries if e.action == "alert"]) >= 3, what="the pages"
            )
            assert agent.metrics.events.labels("kmsg", "xid")._value.get() == 2
        alerts = sorted(e.params["summary"] for e in engine.audit.entries if e.rule == "mig-instance-xid")
        assert alerts == [
            "Xid 94 GPU 0000:01:00.0 GI 5 CI ?",
            "Xid 95 GPU 0000:01:00.0 GI 1 CI 2",
        ]
        # the pack: Xid 95 drains the node and resets the GPU, Xid 94 (contained) does not
        drains = [a for a in scheduler_actions(engine.audit.entries) if a.action == "drain"]
        reasons = [d.params["reason"] for d in drains]
        assert reasons == ["Xid95 01:00 uncontained ECC error (GPU 0000:01:00.0)"]
