"""The agent's merge of one Xid seen by two sources (kernel log, NVML events), MIG instances included."""

from watchd.agent.xid_dedup import XidDeduplicator
from watchd.clock import FakeClock

GPU = "0000:01:00.0"


def dedup() -> tuple[XidDeduplicator, FakeClock]:
    clock = FakeClock(1000.0)
    return XidDeduplicator(clock, window_s=10.0), clock


def test_a_second_source_reporting_the_same_xid_is_merged_and_the_same_source_never_is() -> None:
    d, clock = dedup()
    assert d.first(GPU, 79, "nvml")
    assert not d.first(GPU, 79, "kmsg")
    assert d.first(GPU, 79, "nvml"), "a repeat from the same source is another Xid"
    clock.advance(11)
    assert d.first(GPU, 79, "kmsg"), "outside the window: a new Xid"
    assert d.suppressed == 1


def test_two_gpu_instances_of_one_gpu_are_two_faults() -> None:
    d, _ = dedup()
    assert d.first(GPU, 94, "kmsg", gpu_instance=1, compute_instance=0)
    assert d.first(GPU, 94, "journald", gpu_instance=2, compute_instance=0), "another GPU instance"
    assert d.first(GPU, 94, "journald", gpu_instance=1, compute_instance=1), "another compute instance"
    assert not d.first(GPU, 94, "file", gpu_instance=2, compute_instance=0), "the same instance, twice"
    assert d.suppressed == 1


def test_a_report_without_an_instance_is_merged_with_any_instance_of_that_gpu() -> None:
    # NVML's events name no instance: the kernel line of the same Xid is the same fault, and the other way
    d, _ = dedup()
    assert d.first(GPU, 94, "kmsg", gpu_instance=5)
    assert not d.first(GPU, 94, "nvml")
    d2, _ = dedup()
    assert d2.first(GPU, 94, "nvml")
    assert not d2.first(GPU, 94, "kmsg", gpu_instance=5, compute_instance=2)


def test_memory_stays_bounded() -> None:
    clock = FakeClock(0.0)
    d = XidDeduplicator(clock, max_keys=100)
    for i in range(1000):
        d.first(f"0000:{i % 256:02x}:00.0", i, "kmsg", gpu_instance=i % 7)
    assert len(d._seen) <= 100
    for gi in range(1000):
        d.first(GPU, 94, "kmsg", gpu_instance=gi)
    assert all(len(w) <= 64 for w in d._seen.values())
