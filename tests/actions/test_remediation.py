"""The remediation subsystem over the fake scheduler (which behaves as Slurm 22.05 does): a reboot is followed
until the node has a new boot, announced once; overdue once; rebuilt from the audit trail at start."""

from __future__ import annotations

import asyncio

from watchd.actions.audit import AuditRecord
from watchd.actions.remediation import Remediation, awaiting_from
from watchd.actions.settings import RemediationConfig
from watchd.clock import FakeClock
from watchd.integrations.fake.scheduler import FakeScheduler
from watchd.model.events import Event


class Trail:
    def __init__(self, records: list[AuditRecord]) -> None:
        self.records = records

    def recent(self, limit: int = 100, node: str | None = None) -> list[AuditRecord]:
        return [r for r in self.records if node is None or r.node == node][-limit:]

    def since(self, time: float, limit: int) -> list[AuditRecord]:
        return sorted((r for r in self.records if r.time > time), key=lambda r: r.time)[:limit]


def reboot_record(t: float, node: str = "gpu-1", boot: str = "boot-1") -> AuditRecord:
    return AuditRecord(
        t, "xid-fatal-hardware", "e", node, "reboot", "enforce", "rebooting",
        result={"requested_at": t, "boot_id": boot},
    )  # fmt: skip


async def test_a_reboot_is_followed_until_the_node_has_a_new_boot() -> None:
    fake = FakeScheduler()
    fake.add_node("gpu-1", flags={"DRAIN"}, reason="watchd: Xid 79")
    assert (await fake.reboot("gpu-1", "reboot after Xid 79")).outcome == "rebooting"
    assert (await fake.reboot("gpu-1", "again")).detail == "a reboot is pending already"  # never twice
    clock = FakeClock(1000.0)
    emitted: list[Event] = []

    async def emit(event: Event) -> None:
        emitted.append(event)

    watch = Remediation(fake, Trail([reboot_record(1000.0)]), RemediationConfig(), clock, emit, lambda: True)
    await watch.start()
    assert set(watch.awaited) == {"gpu-1"}
    await watch.poll()
    assert emitted == []  # REBOOT_ISSUED: not back yet
    fake.complete_reboot("gpu-1", "boot-2")
    clock.advance(40)
    await watch.poll()
    [back] = emitted
    assert (back.kind, back.node, back.attrs["after_s"], back.attrs["boot_id"]) == (
        "node_rebooted", "gpu-1", 40.0, "boot-2",
    )  # fmt: skip
    await watch.poll()
    assert len(emitted) == 1 and watch.awaited == {}


async def test_a_node_not_back_in_time_is_reported_once_and_a_follower_reads_nothing() -> None:
    fake = FakeScheduler()
    fake.add_node("gpu-1", flags={"DRAIN", "REBOOT_ISSUED"}, reason="watchd: x")
    clock = FakeClock(1000.0)
    emitted: list[Event] = []

    async def emit(event: Event) -> None:
        emitted.append(event)

    leading = [False]
    config = RemediationConfig(return_timeout_s=600)
    watch = Remediation(fake, Trail([reboot_record(1000.0)]), config, clock, emit, lambda: leading[0])
    await watch.start()
    clock.advance(700)
    await watch.poll()
    assert emitted == [] and ("node_states", ["gpu-1"]) not in fake.calls  # a follower asks nothing
    leading[0] = True
    await watch.poll()
    await watch.poll()
    assert [e.kind for e in emitted] == ["node_reboot_overdue"]


def test_what_is_awaited_comes_from_the_trail() -> None:
    validated = AuditRecord(50, "validate", "e", "gpu-1", "validate", "enforce", "resumed")
    dry = AuditRecord(60, "r", "e", "gpu-3", "reboot", "dry-run", "dry_run")
    records = [reboot_record(10), validated, reboot_record(20, "gpu-2", "b"), dry]
    assert set(awaiting_from(records)) == {"gpu-2"}


def test_the_watch_polls_only_with_a_scheduler() -> None:
    async def emit(event: Event) -> None:
        return None

    watch = Remediation(None, Trail([]), RemediationConfig(), FakeClock(0.0), emit, lambda: True)
    assert watch.jobs() == ()
    asyncio.run(watch.start())


async def test_a_reboot_audited_after_start_is_followed_too() -> None:
    """A reboot driven again after a restart is audited once the watch has started, without a feedback
    event: the next poll reads it from the trail."""
    fake = FakeScheduler()
    fake.add_node("gpu-1", flags={"DRAIN"}, reason="watchd: Xid 79")
    trail = Trail([])
    emitted: list[Event] = []

    async def emit(event: Event) -> None:
        emitted.append(event)

    watch = Remediation(fake, trail, RemediationConfig(), FakeClock(1000.0), emit, lambda: True)
    await watch.start()
    assert watch.awaited == {}
    await fake.reboot("gpu-1", "x")
    trail.records.append(reboot_record(1001.0, boot="boot-1"))
    fake.complete_reboot("gpu-1", "boot-2")
    await watch.poll()
    assert [e.kind for e in emitted] == ["node_rebooted"]


def reset_record(t: float, node: str = "gpu-1", command: str = "gpu-reset-abc") -> AuditRecord:
    return AuditRecord(
        t, "xid-gpu-reset", "e", node, "gpu_reset", "enforce", "reset",
        result={"requested_at": t - 12.5, "command": command, "gpus": ["0000:3b:00.0"]},
    )  # fmt: skip


async def test_a_gpu_reset_done_is_announced_once_at_once_and_rebuilt_at_start() -> None:
    """The executor's feedback of a ``reset`` announces it at once (no poll waited for); a restart reads the
    reset from the trail and announces what was not validated since; a follower announces nothing."""
    trail = Trail([])
    emitted: list[Event] = []
    leading = [True]

    async def emit(event: Event) -> None:
        emitted.append(event)

    config = RemediationConfig()
    watch = Remediation(FakeScheduler(), trail, config, FakeClock(1000.0), emit, lambda: leading[0])
    await watch.start()
    trail.records.append(reset_record(1001.0))
    feedback = Event(
        "f1", "gpu-1", "watchd", "watchd_action", 1001.0,
        {"action": "gpu_reset", "outcome": "reset", "rule": "xid-gpu-reset", "mode": "enforce"},
    )  # fmt: skip
    watch.observe(feedback)
    await asyncio.gather(*watch._background)
    [done] = emitted
    assert (done.kind, done.node, done.source) == ("node_gpu_reset", "gpu-1", "watchd:reboots")
    assert done.attrs == {
        "requested_at": 988.5, "after_s": 12.5, "gpus": "0000:3b:00.0", "command": "gpu-reset-abc",
    }  # fmt: skip
    await watch.poll()
    assert len(emitted) == 1, "announced once"
    await watch.stop()

    # a restart: the reset not validated since is announced again (validation is de-duplicated or reruns)
    again = Remediation(FakeScheduler(), trail, config, FakeClock(1100.0), emit, lambda: leading[0])
    leading[0] = False
    await again.start()
    await again.poll()
    assert len(emitted) == 1, "a follower announces nothing"
    leading[0] = True
    await again.poll()
    assert [e.id for e in emitted] == [done.id] * 2  # the same event id
    # validated since: nothing to announce after a restart
    trail.records.append(AuditRecord(1050, "validate", "e", "gpu-1", "validate", "enforce", "resumed"))
    third = Remediation(FakeScheduler(), trail, config, FakeClock(1100.0), emit, lambda: True)
    await third.start()
    await third.poll()
    assert len(emitted) == 2 and third.resets == {}
