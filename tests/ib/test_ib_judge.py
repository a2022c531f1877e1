"""Port conditions from real layouts: the tree is changed as the kernel would change it between scans (a
port going down, a link retraining at a lower rate, counters rising, saturating, being cleared, a device
leaving and coming back), read with the real reader and judged."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.ib.tree import NODE_EXPORTER, RECORDED, add_hca, copy_recorded, ndr_node, port, write
from watchd.ib.judge import MAX_TRACKED, IbJudge, IbParams
from watchd.ib.reader import SysfsReader
from watchd.ib.sysfs import PortReading, Snapshot
from watchd.model.events import Event
from watchd.model.ib import COUNTER_WIDTHS, KIND, IbPortHealth

T0 = 1_800_000_000.0


class Node:
    """A tree, its reader and a judge; ``scan(dt)`` moves time on and returns the events."""

    def __init__(self, root: Path, params: IbParams | None = None, hw: tuple[str, ...] = ()) -> None:
        self.root = root
        params = params or IbParams()
        extra = tuple(c for c in params.error_thresholds if c not in COUNTER_WIDTHS)
        self.reader = SysfsReader(root, counters=(*COUNTER_WIDTHS, *extra), hw_counters=(*hw, *extra))
        self.judge = IbJudge("gpu-7", params)
        self.now = T0

    def scan(self, dt: float = 15.0) -> list[IbPortHealth]:
        self.now += dt
        events = self.judge.observe(self.reader.scan(self.now))
        return [health(e) for e in events]

    def set(self, device: str, name: str, line: str, number: int = 1) -> None:
        write(port(self.root, device, number) / name, line)


def health(e: Event) -> IbPortHealth:
    assert (e.kind, e.node, e.source) == (KIND, "gpu-7", "ib-sysfs")
    h = IbPortHealth.read(e)
    assert h is not None and not h.extra, e
    return h


def brief(events: list[IbPortHealth]) -> list[tuple[Any, ...]]:
    return [(h.condition, f"{h.device}:{h.port}", h.value) for h in events]


def test_a_port_that_goes_down_is_reported_repeated_while_down_and_cleared(tmp_path: Path) -> None:
    node = Node(ndr_node(tmp_path))
    assert node.scan() == []  # all ACTIVE at 400: nothing to say
    node.set("mlx5_3", "state", "1: DOWN")
    node.set("mlx5_3", "phys_state", "3: Disabled")
    node.set("mlx5_3", "rate", "10 Gb/sec (4X SDR)")  # what a down port's rate reads (SDR by default)
    [down] = node.scan()
    assert (down.condition, down.device, down.port, down.value) == ("port_down", "mlx5_3", 1, 1)
    assert (down.state, down.phys_state, down.link_layer, down.hca_type) == (
        "DOWN",
        "Disabled",
        "InfiniBand",
        "MT4129",
    )
    assert down.evidence == "mlx5_3:1 DOWN (physical Disabled), was ACTIVE at 400 Gb/sec"
    assert node.scan() == []  # 15 s later: not yet the report interval (60 s)
    node.set("mlx5_3", "phys_state", "2: Polling")  # the cable is back, training: a change is reported
    [polling] = node.scan()
    assert polling.phys_state == "Polling" and polling.value == 1
    assert node.scan() == [] and node.scan() == [] and node.scan() == []
    assert brief(node.scan()) == [("port_down", "mlx5_3:1", 1)]  # 60 s after the last report
    node.set("mlx5_3", "state", "4: ACTIVE")
    node.set("mlx5_3", "phys_state", "5: LinkUp")
    node.set("mlx5_3", "rate", "400 Gb/sec (4X NDR)")
    [up] = node.scan()
    assert (up.condition, up.value, up.state) == ("port_down", 0, "ACTIVE")
    assert node.scan() == []


def test_a_port_never_seen_up_is_not_reported_unless_expected(tmp_path: Path) -> None:
    root = copy_recorded(tmp_path)
    write(port(root, "mlx4_0", 2) / "state", "1: DOWN")  # the unused second port of a dual-port HCA
    write(port(root, "mlx4_0", 2) / "phys_state", "3: Disabled")
    assert Node(root).scan() == []
    node = Node(root, IbParams(expected_ports=("mlx4_0:*",)))
    [down] = node.scan()
    assert (down.device, down.port, down.evidence) == (
        "mlx4_0",
        2,
        "mlx4_0:2 DOWN (physical Disabled), expected ACTIVE",
    )


def test_init_and_armed_are_down_with_the_physical_link_up(tmp_path: Path) -> None:
    """A port the subnet manager has not activated (INIT) carries no traffic: down, with LinkUp saying the
    cable is fine (the shipped rules page for it, and drain only when the physical link is lost)."""
    node = Node(ndr_node(tmp_path, 2))
    node.scan()
    node.set("mlx5_1", "state", "2: INIT")
    [down] = node.scan()
    assert (down.condition, down.state, down.phys_state) == ("port_down", "INIT", "LinkUp")


def test_a_downtrained_rate_is_reported_after_two_scans_against_the_ports_own_best(tmp_path: Path) -> None:
    node = Node(ndr_node(tmp_path, 1))  # one HCA: no peers, the port's own rate is the reference
    node.scan()
    node.set("mlx5_0", "rate", "200 Gb/sec (2X NDR)")  # two lanes lost
    assert node.scan() == []  # one scan is not a streak
    [slow] = node.scan()
    assert (slow.condition, slow.value, slow.threshold, slow.reference) == (
        "rate_downtrained",
        200.0,
        400.0,
        "port_max",
    )
    assert slow.evidence == "mlx5_0:1 at 200 Gb/sec (2X NDR), below 400 Gb/sec (the rate this port ran at)"
    node.set("mlx5_0", "rate", "100 Gb/sec (1X NDR)")  # worse: reported at once
    assert brief(node.scan()) == [("rate_downtrained", "mlx5_0:1", 100.0)]
    node.set("mlx5_0", "rate", "400 Gb/sec (4X NDR)")
    assert node.scan() == []  # one good scan does not clear it
    [clear] = node.scan()
    assert (clear.condition, clear.value, clear.rate_gbps) == ("rate_downtrained", 0, 400.0)


def test_a_port_already_slow_at_start_is_judged_against_its_peers(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 4)
    write(port(root, "mlx5_2") / "rate", "200 Gb/sec (4X HDR)")
    node = Node(root)
    assert node.scan() == []
    [slow] = node.scan()
    assert (slow.device, slow.value, slow.threshold, slow.reference) == ("mlx5_2", 200.0, 400.0, "peers")
    assert slow.evidence.endswith("below 400 Gb/sec (the rate of mlx5_0:1)")


def test_peers_are_the_same_hca_type_and_link_layer(tmp_path: Path) -> None:
    """A RoCE port (Ethernet) at 200 beside InfiniBand ports at 400 on the same HCA model is not slow, nor is
    an older HCA model."""
    root = ndr_node(tmp_path, 2)
    roce = add_hca(root, "roceP22p1s0f0", rate="200 Gb/sec (4X HDR)")
    write(roce / "link_layer", "Ethernet")
    old = add_hca(root, "mlx5_9", rate="100 Gb/sec (4X EDR)")
    write(old.parent.parent / "hca_type", "MT4123")
    node = Node(root)
    assert node.scan() == [] and node.scan() == [] and node.scan() == []


def test_the_configured_rate_is_the_reference_and_the_recorded_1x_link_is_below_it(tmp_path: Path) -> None:
    node = Node(copy_recorded(tmp_path), IbParams(expected_rates={"mlx5_*:1": 100.0}))
    assert node.scan() == []
    [slow] = node.scan()
    assert (slow.device, slow.value, slow.threshold, slow.reference) == ("mlx5_0", 25.0, 100.0, "expected")
    assert slow.evidence == "mlx5_0:1 at 25 Gb/sec (1X EDR), below 100 Gb/sec (the configured rate)"


def test_rising_link_counters_are_reported_per_counter_and_clear_after_the_window(tmp_path: Path) -> None:
    node = Node(ndr_node(tmp_path, 2))
    node.scan()
    symbols = port(node.root, "mlx5_1") / "counters" / "symbol_error"
    write(symbols, "1500")
    assert node.scan() == []  # 1500 in the window: under 3000
    write(symbols, "3100")
    node.set("mlx5_1", "counters/link_downed", "1")  # the link went down and up between two scans
    events = node.scan()
    assert brief(events) == [
        ("link_errors", "mlx5_1:1", 1),
        ("link_errors", "mlx5_1:1", 3100),
    ]
    flap, symbol = events
    assert (flap.counter, flap.count, flap.threshold, flap.saturated) == ("link_downed", 1, 1, False)
    assert symbol.evidence == "mlx5_1:1 symbol_error +3100 in 300s (count 3100)"
    assert node.scan(30.0) == []  # holding: reported again at the interval (60 s) only
    for _ in range(4):  # 90 s to 270 s after the rise: still within the 300 s window
        assert sorted((h.counter, h.value) for h in node.scan(60.0)) == [
            ("link_downed", 1),
            ("symbol_error", 3100),
        ]
    cleared = node.scan(60.0)  # 330 s: the rises left the window
    assert sorted((h.counter, h.value) for h in cleared) == [("link_downed", 0), ("symbol_error", 0)]


def test_a_saturated_counter_counts_its_last_rise_and_nothing_after(tmp_path: Path) -> None:
    node = Node(ndr_node(tmp_path, 1), IbParams(error_thresholds={"symbol_error": 100}))
    symbols = port(node.root, "mlx5_0") / "counters" / "symbol_error"
    write(symbols, "65400")
    node.scan()
    write(symbols, "65535")  # 16 bits: the PortCounters stop here
    [full] = node.scan()
    assert (full.value, full.saturated, full.count) == (135, True, 65535)
    assert full.evidence.endswith("(count 65535, saturated: it no longer counts, clear it with perfquery -R)")
    for _ in range(24):
        events = node.scan()
        assert all(h.value in (0, 135) for h in events)  # stuck at the top: no new rise, ever
    assert brief(events) == [] or events[-1].value == 0


def test_the_recorded_32_bit_counter_at_its_maximum_is_a_base_not_a_rise(tmp_path: Path) -> None:
    """node_exporter's mlx4_0 records port_xmit_wait at 4294967295 (32 bits, saturated)."""
    root = copy_recorded(tmp_path, NODE_EXPORTER)
    node = Node(root, IbParams(error_thresholds={"port_xmit_wait": 1}))
    for _ in range(5):
        assert node.scan() == []
    view = node.judge.ports["mlx4_0:1"]
    assert view.counters["port_xmit_wait"].saturated and view.counters["port_xmit_wait"].prev == 2**32 - 1
    # cleared, then a 32-bit counter climbing to its top counts what it climbed
    waits = port(root, "mlx4_0", 1) / "counters" / "port_xmit_wait"
    write(waits, "0")  # cleared (perfquery -R)
    assert node.scan() == []
    write(waits, "1000")  # still below the old value: the clear is believed, 0 the new base
    [first] = node.scan()
    assert (first.value, first.saturated) == (1000, False)
    write(waits, str(2**32 - 1))
    [rise] = node.scan(60.0)  # held: reported again at the interval
    assert (rise.counter, rise.value, rise.saturated) == ("port_xmit_wait", 2**32 - 1, True)


def test_a_counter_that_goes_down_was_cleared_and_is_a_new_base(tmp_path: Path) -> None:
    node = Node(ndr_node(tmp_path, 1), IbParams(error_thresholds={"link_error_recovery": 5}))
    recovery = port(node.root, "mlx5_0") / "counters" / "link_error_recovery"
    write(recovery, "200")
    node.scan()  # the first reading is the base: what happened before the agent watched is not reported
    write(recovery, "0")  # perfquery -R, or a driver reload
    assert node.scan() == []
    write(recovery, "4")
    assert node.scan() == []  # 4 from the new base
    write(recovery, "5")
    [rise] = node.scan()
    assert (rise.counter, rise.value) == ("link_error_recovery", 5)


def test_one_low_read_of_a_counter_is_no_reset_and_its_history_is_not_counted_again(tmp_path: Path) -> None:
    """A counter that reads lower once (a read racing the firmware's update, a glitch) and then its old value
    again was not cleared: a reset-and-climb of its whole value would report years of errors as new ones (and
    a hang's finding take them as the NIC's fault)."""
    node = Node(ndr_node(tmp_path, 1), IbParams(error_thresholds={"symbol_error": 100, "link_downed": 1}))
    symbols = port(node.root, "mlx5_0") / "counters" / "symbol_error"
    downed = port(node.root, "mlx5_0") / "counters" / "link_downed"
    write(symbols, "40000")
    write(downed, "7")
    node.scan()  # the base
    write(symbols, "0")
    write(downed, "0")
    assert node.scan() == []  # one low read
    write(symbols, "40000")
    write(downed, "7")
    assert node.scan() == []  # back at the old values: nothing happened
    write(symbols, "39990")
    assert node.scan() == []
    write(symbols, "40050")  # a low read, then a real rise: only the rise over the old value counts
    assert node.scan() == []
    write(symbols, "40100")
    [rise] = node.scan()
    assert (rise.counter, rise.value, rise.count) == ("symbol_error", 100, 40100)
    view = node.judge.ports["mlx5_0:1"]
    assert view.counters["link_downed"].prev == 7 and not view.counters["link_downed"].increases


def test_a_saturated_counter_cleared_counts_from_zero_once_the_clear_persists(tmp_path: Path) -> None:
    node = Node(ndr_node(tmp_path, 1), IbParams(error_thresholds={"symbol_error": 100}))
    symbols = port(node.root, "mlx5_0") / "counters" / "symbol_error"
    write(symbols, "65535")  # 16 bits, saturated when the agent starts: a base
    assert node.scan() == []
    write(symbols, "0")  # perfquery -R
    assert node.scan() == []
    write(symbols, "60")
    assert node.scan() == []  # 60 from the new base
    write(symbols, "160")
    [rise] = node.scan()
    assert (rise.value, rise.count, rise.saturated) == (160, 160, False)


def test_a_device_that_returns_with_its_counters_reset_starts_from_a_new_base(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 2)
    node = Node(root, IbParams(error_thresholds={"link_downed": 1}))
    downed = port(root, "mlx5_1") / "counters" / "link_downed"
    write(downed, "12")
    node.scan()
    shutil.move(root / "mlx5_1", tmp_path / "mlx5_1")  # the driver reloads: the device leaves ...
    [gone] = node.scan()
    assert (gone.condition, gone.value) == ("port_down", 1)
    shutil.move(tmp_path / "mlx5_1", root / "mlx5_1")
    # ... and comes back with its counters restarted, the reload's own link transitions counted (13, more
    # than before by chance): a new base, not a rise of 1 over the old one
    write(downed, "13")
    assert brief(node.scan()) == [("port_down", "mlx5_1:1", 0)]
    assert node.scan() == []
    write(downed, "14")
    [flap] = node.scan()
    assert (flap.counter, flap.value) == ("link_downed", 1)


def test_a_device_that_leaves_is_down_until_it_returns_and_a_new_one_starts_quiet(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 3)
    node = Node(root)
    node.scan()
    shutil.move(root / "mlx5_2", tmp_path / "mlx5_2")  # the HCA fell off the bus (or its driver left)
    [gone] = node.scan()
    assert (gone.condition, gone.device, gone.state, gone.phys_state, gone.value) == (
        "port_down",
        "mlx5_2",
        "missing",
        "missing",
        1,
    )
    assert gone.evidence == "mlx5_2 is gone from /sys/class/infiniband (was ACTIVE at 400 Gb/sec)"
    assert gone.link_layer == "InfiniBand"  # what it was
    shutil.move(tmp_path / "mlx5_2", root / "mlx5_2")
    write(port(root, "mlx5_2") / "counters" / "symbol_error", "0")  # a reloaded driver starts at 0
    write(port(root, "mlx5_2") / "counters" / "link_downed", "0")
    add_hca(root, "mlx5_3")  # and a device appears
    write(port(root, "mlx5_3") / "counters" / "symbol_error", "90000")  # its first reading is its base
    [back] = node.scan()
    assert (back.condition, back.device, back.value) == ("port_down", "mlx5_2", 0)
    assert node.scan() == []


def test_a_device_gone_before_it_was_ever_up_is_forgotten_quietly(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 2)
    write(port(root, "mlx5_1") / "state", "1: DOWN")
    node = Node(root)
    node.scan()
    shutil.rmtree(root / "mlx5_1")
    assert node.scan() == [] and "mlx5_1:1" not in node.judge.ports


def test_the_class_folder_gone_takes_every_port_that_was_up_down(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 2)
    node = Node(root)
    node.scan()
    shutil.rmtree(root)  # the RDMA core module unloaded
    assert brief(node.scan()) == [("port_down", "mlx5_0:1", 1), ("port_down", "mlx5_1:1", 1)]


def test_an_unreadable_file_judges_nothing(tmp_path: Path) -> None:
    root = ndr_node(tmp_path, 2)
    node = Node(root)
    node.scan()
    node.set("mlx5_1", "state", "1: DOWN")
    assert brief(node.scan()) == [("port_down", "mlx5_1:1", 1)]
    state = port(root, "mlx5_1") / "state"
    state.unlink()
    state.mkdir()  # unreadable now: the condition stays as it was, no clear, no new start
    for _ in range(3):
        assert node.scan() == []
    assert node.judge.ports["mlx5_1:1"].active() == ["port_down"]


def test_a_clock_stepped_back_restarts_the_windows_without_events(tmp_path: Path) -> None:
    node = Node(ndr_node(tmp_path, 1))
    node.scan()
    write(port(node.root, "mlx5_0") / "counters" / "symbol_error", "2000")
    node.scan()
    node.now -= 3600.0
    write(port(node.root, "mlx5_0") / "counters" / "symbol_error", "3000")
    assert node.scan() == []  # the 2000 before the step are not added to the 1000 after


def test_gone_ports_are_bounded() -> None:
    judge = IbJudge("n")
    many = tuple(PortReading(f"d{i}", 1, state=4) for i in range(MAX_TRACKED + 50))
    judge.observe(Snapshot(1.0, many))
    judge.observe(Snapshot(2.0, ()))
    assert len(judge.ports) == MAX_TRACKED


def test_the_event_ids_are_stable_per_port_condition_and_time(tmp_path: Path) -> None:
    a, b = Node(ndr_node(tmp_path / "a", 1)), Node(ndr_node(tmp_path / "b", 1))
    for n in (a, b):
        n.scan()
        n.set("mlx5_0", "state", "1: DOWN")
    ea = a.judge.observe(a.reader.scan(T0 + 30))
    eb = b.judge.observe(b.reader.scan(T0 + 30))
    assert [e.id for e in ea] == [e.id for e in eb] and len(ea) == 1


def test_recorded_trees_are_quiet() -> None:
    for root in (RECORDED, NODE_EXPORTER):
        node = Node(root)
        for _ in range(4):
            assert node.scan() == []
