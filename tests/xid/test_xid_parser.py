from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchd.xid import XidParser, XidRecord, parse_text
from watchd.xid.parser import DEDUP_WINDOW, MULTILINE_SPAN, UUID_MAP_SIZE, strip_prefix

UUID = "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3b"
FULL = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def one(line: str) -> XidRecord:
    records = XidParser().feed(line)
    assert len(records) == 1, records
    return records[0]


def feed_all(lines: list[str], parser: XidParser | None = None) -> list[XidRecord]:
    parser = parser or XidParser()
    out: list[XidRecord] = []
    for line in lines:
        out.extend(parser.feed(line))
    return out


def noise(n: int) -> list[str]:
    return [f"[{1000 + i}.000000] eth0: link up, 100Gbps" for i in range(n)]


# --- Xid line formats ------------------------------------------------------------------------------


def test_full_line() -> None:
    rec = one(FULL)
    assert rec == XidRecord(
        xid=79,
        pci_bus_id="0000:3b:00.0",
        pid=1234,
        process="python3",
        message="GPU has fallen off the bus.",
        raw=FULL,
    )
    assert rec.uuid is None
    assert rec.details == {}


@pytest.mark.parametrize(
    ("line", "pid", "process", "message"),
    [
        (
            "NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            None,
            None,
            "GPU has fallen off the bus.",
        ),
        (
            "NVRM: Xid (PCI:0000:05:00): 43, pid=<unknown>, name=<unknown>, Ch 00000008",
            None,
            None,
            "Ch 00000008",
        ),
        (
            "NVRM: Xid (PCI:0000:65:00): 31, pid=4123, name=nvc:[driver], Ch 00000010, intr 10000000. "
            "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_8c000000. Fault is of type "
            "FAULT_PDE ACCESS_TYPE_READ",
            4123,
            "nvc:[driver]",
            "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
            "0x7f2a_8c000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
        ),
        (
            "NVRM: Xid (PCI:0000:65:00): 13, pid=77, name=pt_main_thread worker 3, Graphics Exception: "
            "ESR 0x1",
            77,
            "pt_main_thread worker 3",
            "Graphics Exception: ESR 0x1",
        ),
        # older drivers: no name=
        (
            "NVRM: Xid (PCI:0000:3b:00): 13, pid=2321, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): "
            "Out Of Range Address",
            2321,
            None,
            "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
        ),
        # older drivers: no pid= either
        (
            "NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception: ESR 0x50df30=0x10f",
            None,
            None,
            "Graphics Exception: ESR 0x50df30=0x10f",
        ),
        ("NVRM: Xid (PCI:0000:00:1e): 31", None, None, ""),
        (
            "NVRM: Xid (PCI:0000:00:1b): 43, pid=3885519, name=gpu-burner, channel 0x00000010",
            3885519,
            "gpu-burner",
            "channel 0x00000010",
        ),
        ("NVRM: Xid (PCI:0000:00:1b): 43, pid=3885519, name=gpu-burner", 3885519, "gpu-burner", ""),
    ],
)
def test_pid_name_message(line: str, pid: int | None, process: str | None, message: str) -> None:
    rec = one(line)
    assert (rec.pid, rec.process, rec.message) == (pid, process, message)
    assert rec.raw == line


def test_older_driver_without_pci_prefix() -> None:
    rec = one("NVRM: Xid (0000:01:00): 8, Channel 0000000a")
    assert (rec.xid, rec.pci_bus_id, rec.pid, rec.process, rec.message) == (
        8,
        "0000:01:00.0",
        None,
        None,
        "Channel 0000000a",
    )


@pytest.mark.parametrize(
    ("line", "pci"),
    [
        (
            "NVRM: Xid (PCI:0009:01:00): 119, pid=2186, name=nvidia-smi, Timeout after 6s of waiting",
            "0009:01:00.0",
        ),
        ("NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 09 (0x025525c6)", "0018:01:00.0"),
        (
            "NVRM: Xid (0019:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
            "(GPU Reset Required)",
            "0019:01:00.0",
        ),
    ],
)
def test_non_zero_domains(line: str, pci: str) -> None:
    assert one(line).pci_bus_id == pci


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:3b): 79, GPU has fallen off the bus.",  # not a PCI address
        "NVRM: Xid (PCI:zzzz:3b:00): 79, GPU has fallen off the bus.",
        "NVRM: Xid error: xyz, invalid data",
        "NVRM: Xid (PCI:0000:65:00): invalid",
        "NVRM: Xid (PCI:0000:65:00)",
        "NVRM: Xid: 31",
        "NVRM: Xid (PCI:0000:65:00): 12345678901234567890, overflow",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "NVRM: GPU 0000:5d:00.0: GPU serial number is 1234567890.",
        "NVRM: A GPU crash dump has been created. If possible, please run",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 46 MC TS crumbstore MCTO",
        "eth0: NIC Link is Up 100 Gbps",
        "",
    ],
)
def test_ignored(line: str) -> None:
    assert XidParser().feed(line) == []


# --- prefixes --------------------------------------------------------------------------------------

PREFIXES = [
    "",
    "[12345.678901] ",
    "[    5.000001] ",
    "[Wed Dec  2 10:00:01 2026] ",
    "kernel: ",
    "Dec  2 10:00:01 gpu-node-17 kernel: ",
    "Dec 02 10:00:01 gpu-node-17 kernel: ",  # journalctl -k (short)
    "Dec 02 10:00:01.123456 gpu-node-17 kernel: ",  # journalctl -o short-precise
    "Dec  2 10:00:01 gpu-node-17 kernel: [12345.678901] ",  # syslog around the uptime
    "2026-12-02T10:00:01.123456+00:00 gpu-node-17 kernel: ",  # RFC 3339 (rsyslog)
    "2026-12-02T10:00:01+0000 gpu-node-17 kernel: ",  # journalctl -o short-iso
    "Wed 2026-12-02 10:00:01 UTC gpu-node-17 kernel: ",  # journalctl -o short-full
    "[12345.678901] gpu-node-17 kernel: ",  # journalctl -o short-monotonic
    "MESSAGE=",  # journalctl -o export
    "<4>",
    "<4>Dec  2 10:00:01 gpu-node-17 kernel: ",
    "4,1234,5678901,-;",  # raw /dev/kmsg
    "4,1234,5678901,-,caller=T812;",
    "kern  :warn  : [12345.678901] ",  # dmesg -x
    "[12345.678901] [  T812] ",  # printk caller id
    "  ",
]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_prefixes(prefix: str) -> None:
    rec = one(prefix + FULL + "\n")
    assert rec.raw == FULL
    assert (rec.xid, rec.pci_bus_id, rec.pid, rec.process) == (79, "0000:3b:00.0", 1234, "python3")


@pytest.mark.parametrize("prefix", PREFIXES)
def test_prefixes_on_every_form(prefix: str) -> None:
    lines = [
        "NVRM: GPU at PCI:0000:b3:00: " + UUID,
        "NVRM: The NVIDIA GPU 0000:b3:00.0",
        "NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
        "NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.",
    ]
    records = feed_all([prefix + line for line in lines])
    assert [(r.xid, r.pci_bus_id, r.uuid) for r in records] == [
        (79, "0000:b3:00.0", UUID),
        (79, "0000:5d:00.0", None),
    ]


# --- MIG ------------------------------------------------------------------------------------------

MIG_GI = (
    "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No"
)
MIG_GI_CI = "NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:02): 94, pid=7194, name=python3, Contained: SM (0x1)."


@pytest.mark.parametrize("prefix", PREFIXES)
def test_mig_xids_name_their_gpu_instance_and_compute_instance(prefix: str) -> None:
    gi, gi_ci = feed_all([prefix + MIG_GI, prefix + MIG_GI_CI])
    assert (gi.xid, gi.pci_bus_id, gi.gpu_instance, gi.compute_instance, gi.pid) == (
        94,
        "0000:01:00.0",
        5,
        None,
        7194,
    )
    assert gi.message == "Contained: CE User Channel (0x9). RST: No, D-RST: No"
    assert gi.raw == MIG_GI
    assert (gi_ci.gpu_instance, gi_ci.compute_instance, gi_ci.process) == (1, 2, "python3")
    assert gi_ci.message == "Contained: SM (0x1)."


def test_a_gpu_not_in_mig_mode_names_no_instance() -> None:
    rec = one(FULL)
    assert (rec.gpu_instance, rec.compute_instance) == (None, None)


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:01:00 GPU-I:xx): 94, text",  # not a number
        "NVRM: Xid (PCI:0000:01:00 GPU-CI:02 GPU-I:01): 94, text",  # the driver prints GPU-I first
        "NVRM: Xid (PCI:0000:01:00 junk): 94, text",
    ],
)
def test_malformed_mig_attribution_is_not_an_xid(line: str) -> None:
    assert XidParser().feed(line) == []


def test_mig_xids_with_the_uuid_of_their_gpu() -> None:
    (rec,) = feed_all(["NVRM: GPU at PCI:0000:01:00: " + UUID, MIG_GI])
    assert (rec.uuid, rec.gpu_instance) == (UUID, 5)


@pytest.mark.parametrize(
    "prefix",
    [
        "Dec  2 10:00:01 gpu-node-17 root: ",  # logger
        "Dec  2 10:00:01 gpu-node-17 myapp[4242]: ",
        "2026-12-02T10:00:01.123456+00:00 gpu-node-17 python3[99]: ",
        "random text ",
    ],
)
def test_not_a_kernel_line(prefix: str) -> None:
    assert XidParser().feed(prefix + FULL) == []


def test_strip_prefix() -> None:
    assert strip_prefix("Dec  2 10:00:01 host kernel: [1.5] NVRM: x") == "NVRM: x"
    assert strip_prefix("Dec  2 10:00:01 host sshd[1]: NVRM: x") is None
    assert strip_prefix("plain text") == "plain text"


# --- number-less Xid 79 and de-duplication ---------------------------------------------------------

MULTI = [
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
]
SINGLE = "NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus."


def test_multi_line_79() -> None:
    parser = XidParser()
    assert parser.feed(MULTI[0]) == []
    assert parser.feed(MULTI[1]) == []
    [rec] = parser.feed(MULTI[2])
    assert rec == XidRecord(
        xid=79,
        pci_bus_id="0000:b3:00.0",
        pid=None,
        process=None,
        message="The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the "
        "bus and is not responding to commands.",
        raw="\n".join(MULTI),
        details={"pci_device_id": "10de:26b5"},
    )


def test_multi_line_79_in_one_kmsg_record() -> None:
    # /dev/kmsg keeps a multi-line printk in one record (newlines escaped as \x0a, unescaped by the reader)
    [rec] = XidParser().feed("\n".join(MULTI))
    assert (rec.xid, rec.pci_bus_id, rec.raw) == (79, "0000:b3:00.0", "\n".join(MULTI))


def test_multi_line_79_with_interleaved_line() -> None:
    lines = [MULTI[0], "[1.0] usb 1-1: new device", MULTI[1], MULTI[2]]
    [rec] = feed_all(lines)
    assert rec.raw == "\n".join(MULTI)


def test_multi_line_79_without_middle_line() -> None:
    [rec] = feed_all([MULTI[0], MULTI[2]])
    assert rec.pci_bus_id == "0000:b3:00.0"
    assert rec.details == {}


def test_multi_line_79_too_far_apart() -> None:
    assert feed_all([MULTI[0], MULTI[1], *noise(MULTILINE_SPAN), MULTI[2]]) == []


def test_multi_line_end_alone_is_ignored() -> None:
    assert feed_all(MULTI[1:]) == []


def test_unsupported_gpu_message_is_not_79() -> None:
    lines = [
        "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1c82)",
        "NVRM: installed in this system is not supported by the",
        "NVRM: NVIDIA 470.82.01 driver release.",
    ]
    assert feed_all(lines) == []


def test_single_line_79() -> None:
    rec = one("[ 1234.5] " + SINGLE)
    assert (rec.xid, rec.pci_bus_id, rec.pid, rec.process, rec.message, rec.raw) == (
        79,
        "0000:5d:00.0",
        None,
        None,
        "GPU has fallen off the bus.",
        SINGLE,
    )


def test_single_line_79_without_domain() -> None:
    assert one("NVRM: GPU 18:00.0: GPU has fallen off the bus.").pci_bus_id == "0000:18:00.0"


def explicit(pci: str = "0000:5d:00", pid: int = 1) -> str:
    return f"NVRM: Xid (PCI:{pci}): 79, pid={pid}, name=python3, GPU has fallen off the bus."


def test_explicit_then_numberless_is_one_record() -> None:
    [rec] = feed_all([explicit(), *noise(5), SINGLE])
    assert rec.pid == 1  # the explicit line, with its pid, is the record


def test_numberless_then_explicit_is_one_record() -> None:
    [rec] = feed_all([SINGLE, *noise(5), explicit()])
    assert rec.pid is None
    assert rec.raw == SINGLE


def test_dedup_window_edge() -> None:
    # the report DEDUP_WINDOW lines after the previous one is still the same failure; one more line is not
    assert len(feed_all([explicit(), *noise(DEDUP_WINDOW - 1), SINGLE])) == 1
    assert len(feed_all([explicit(), *noise(DEDUP_WINDOW), SINGLE])) == 2
    assert len(feed_all([SINGLE, *noise(DEDUP_WINDOW - 1), explicit()])) == 1
    assert len(feed_all([SINGLE, *noise(DEDUP_WINDOW), explicit()])) == 2


def test_the_full_driver_sequence_is_one_record() -> None:
    lines = [
        "[ 100.0] NVRM: GPU at PCI:0000:5d:00: " + UUID,
        "[ 100.1] " + explicit(),
        "[ 100.1] " + SINGLE,
        "[ 100.2] NVRM: A GPU crash dump has been created. If possible, please run",
        "[ 100.2] NVRM: nvidia-bug-report.sh as root to collect this data before",
        "[ 100.2] NVRM: the NVIDIA driver reloads.",
        "[ 100.3] NVRM: The NVIDIA GPU 0000:5d:00.0",
        "[ 100.3] NVRM: (PCI ID: 10de:2330) installed in this system has",
        "[ 100.3] NVRM: fallen off the bus and is not responding to commands.",
    ]
    [rec] = feed_all(lines)
    assert (rec.xid, rec.pid, rec.uuid) == (79, 1, UUID)


def test_numberless_forms_together_are_one_record() -> None:
    lines = [
        SINGLE,
        "NVRM: The NVIDIA GPU 0000:5d:00.0",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]
    assert len(feed_all(lines)) == 1


def test_window_slides_with_repeated_reports() -> None:
    # a GPU that keeps reporting the same failure every 15 lines is reported once
    lines = [SINGLE]
    for _ in range(5):
        lines += [*noise(14), SINGLE]
    assert len(feed_all(lines)) == 1


def test_two_explicit_79s_are_two_records() -> None:
    assert [r.pid for r in feed_all([explicit(pid=1), explicit(pid=2)])] == [1, 2]


def test_numberless_explicit_explicit() -> None:
    # the number-less record stands for the first explicit line only
    assert [r.pid for r in feed_all([SINGLE, explicit(pid=1), explicit(pid=2)])] == [None, 2]


def test_dedup_is_per_gpu() -> None:
    records = feed_all([explicit("0000:5d:00"), "NVRM: GPU 0000:5e:00.0: GPU has fallen off the bus."])
    assert [r.pci_bus_id for r in records] == ["0000:5d:00.0", "0000:5e:00.0"]


def test_dedup_only_touches_79() -> None:
    lines = [
        SINGLE,
        "NVRM: Xid (PCI:0000:5d:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node "
        "Reboot Required)",
    ]
    assert [r.xid for r in feed_all(lines)] == [79, 154]


def test_dedup_memory_is_bounded() -> None:
    parser = XidParser()
    for i in range(2000):
        parser.feed(f"NVRM: GPU {i // 32:04x}:{i % 32:02x}:{i % 32:02x}.0: GPU has fallen off the bus.")
    assert len(parser._chains) <= 64 + DEDUP_WINDOW + 1


# --- PCI -> UUID -----------------------------------------------------------------------------------


def test_uuid_attached() -> None:
    lines = [
        "[ 5.1] NVRM: GPU at PCI:0000:9b:00: " + UUID,
        "[ 9.2] NVRM: Xid (PCI:0000:9b:00): 119, pid=2186, name=nvidia-smi, Timeout after 6s of waiting for "
        "RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
        "[ 9.3] NVRM: Xid (PCI:0000:9c:00): 119, pid=2186, name=nvidia-smi, Timeout",
    ]
    first, second = feed_all(lines)
    assert (first.uuid, first.pci_bus_id) == (UUID, "0000:9b:00.0")
    assert second.uuid is None


def test_uuid_older_form_and_update() -> None:
    other = "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7"
    lines = [
        "NVRM: GPU at 0000:03:00: " + UUID,
        "NVRM: GPU at 0000:03:00: " + other,  # the slot now holds another board
        "NVRM: Xid (0000:03:00): 14, Channel 00000001",
    ]
    [rec] = feed_all(lines)
    assert rec.uuid == other


def test_uuid_map_is_bounded() -> None:
    parser = XidParser()
    for i in range(UUID_MAP_SIZE + 1):
        parser.feed(
            f"NVRM: GPU at PCI:{i // 256:04x}:{i % 256:02x}:00: GPU-{i:08x}-0000-0000-0000-000000000000"
        )
    [oldest] = parser.feed("NVRM: Xid (PCI:0000:00:00): 13, pid=1, name=a, x")
    [newest] = parser.feed(f"NVRM: Xid (PCI:{UUID_MAP_SIZE // 256:04x}:{UUID_MAP_SIZE % 256:02x}:00): 13, x")
    assert oldest.uuid is None
    assert newest.uuid == f"GPU-{UUID_MAP_SIZE:08x}-0000-0000-0000-000000000000"
    assert len(parser._uuids) == UUID_MAP_SIZE


# --- details ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "details"),
    [
        (
            "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            {"recovery_action_from": 0, "recovery_action_to": 1, "recovery_action": "GPU_RESET"},
        ),
        (
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            {"recovery_action_from": 0, "recovery_action_to": 2, "recovery_action": "NODE_REBOOT"},
        ),
        (
            "GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)",
            {"recovery_action_from": 4, "recovery_action_to": 1, "recovery_action": "GPU_RESET"},
        ),
        (
            "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
            {"recovery_action_from": 1, "recovery_action_to": 0, "recovery_action": "NONE"},
        ),
        (
            "GPU recovery action changed from 0x0 (None) to 0x5 (Recover IMEX Domain)",
            {"recovery_action_from": 0, "recovery_action_to": 5, "recovery_action": "RECOVER_IMEX_DOMAIN"},
        ),
        (
            "GPU recovery action changed from 0x0 to 0xa (Something New)",
            {"recovery_action_from": 0, "recovery_action_to": 10, "recovery_action": "UNKNOWN"},
        ),
        ("GPU recovery action changed", {}),
    ],
)
def test_xid_154(text: str, details: dict[str, object]) -> None:
    rec = one(f"[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, {text}")
    assert rec.details == details
    assert rec.message == text


@pytest.mark.parametrize(
    ("line", "details"),
    [
        (
            "NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 15 (0x0215e5c6 0x00000000 "
            "0x00000000 0x00000000 0x00000000 0x00000000)",
            {
                "nvlink_subcode": "NETIR_LINK_EVT",
                "nvlink_severity": "fatal",
                "nvlink_link": 15,
                "nvlink_intr_info": "0x0215e5c6",
            },
        ),
        (
            "NVRM: Xid (PCI:0000:00:1e): 145, pid=4, name=<unknown>, RLW_SRC_TRACK Fatal XC0 i1 Link 00 "
            "(0x00000001 0x00000002)",
            {
                "nvlink_subcode": "RLW_SRC_TRACK",
                "nvlink_severity": "fatal",
                "nvlink_link": 0,
                "nvlink_intr_info": "0x00000001",
            },
        ),
        (
            "NVRM: Xid (PCI:0000:00:1e): 149, NETIR_LINK_DOWN Nonfatal XC1 i2 Link 17 (0xDEADBEEF)",
            {
                "nvlink_subcode": "NETIR_LINK_DOWN",
                "nvlink_severity": "nonfatal",
                "nvlink_link": 17,
                "nvlink_intr_info": "0xdeadbeef",
            },
        ),
        (
            "NVRM: Xid (PCI:0000:00:1e): 149, NETIR_LINK_EVT Fatal XC 1 i 2 Link 01 [0x0000000a]",
            {
                "nvlink_subcode": "NETIR_LINK_EVT",
                "nvlink_severity": "fatal",
                "nvlink_link": 1,
                "nvlink_intr_info": "0x0000000a",
            },
        ),
        (
            "NVRM: Xid (PCI:0000:00:1e): 148, NVLPW_CTRL Fatal XC0 i0 Link 05",
            {"nvlink_subcode": "NVLPW_CTRL", "nvlink_severity": "fatal", "nvlink_link": 5},
        ),
        (
            "NVRM: Xid (PCI:0000:b9:00): 145, RLW, nonfatal, cross-contain=0, injected=0, Link 3 "
            "(0x00000004)",
            {
                "nvlink_subcode": "RLW",
                "nvlink_severity": "nonfatal",
                "nvlink_link": 3,
                "nvlink_intr_info": "0x00000004",
            },
        ),
        ("NVRM: Xid (PCI:0000:00:1e): 146, driver-specific detail", {}),
    ],
)
def test_nvlink5(line: str, details: dict[str, object]) -> None:
    assert one(line).details == details


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=a, An uncorrectable double bit error (DBE) has been "
        "detected on GPU in the framebuffer at partition 6, subpartition 0.",
        "NVRM: Xid (PCI:0000:3b:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row "
        "(0x0000000000abcdef) marked for remapping, reset gpu to activate.",
        "NVRM: Xid (PCI:0000:3b:00): 64, pid='<unknown>', name=<unknown>, Row Remapper: Failed to persist",
        "NVRM: Xid (PCI:0000:3b:00): 94, pid=1, name=a, Contained: SM (0x1). RST: No, D-RST: No",
        "NVRM: Xid (PCI:0000:3b:00): 95, pid=1, name=a, Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
        "NVRM: Xid (PCI:0000:3b:00): 149, Fatal",  # no subcode: only what is there
    ],
)
def test_no_invented_details(line: str) -> None:
    rec = one(line)
    assert all(k.startswith("nvlink_") for k in rec.details)
    if rec.xid != 149:
        assert rec.details == {}


# --- API -------------------------------------------------------------------------------------------


def test_parse_text() -> None:
    text = "\n".join(["NVRM: GPU at PCI:0000:3b:00: " + UUID, "noise", FULL, "NVRM: Xid (0000:01:00): 8, x"])
    records = list(parse_text(text.splitlines()))
    assert [(r.xid, r.uuid) for r in records] == [(79, UUID), (8, None)]


def test_records_are_frozen() -> None:
    rec = one(FULL)
    with pytest.raises(AttributeError):
        rec.xid = 1  # type: ignore[misc]


def test_fast() -> None:
    lines = noise(20_000) + [FULL.replace("79", "13")] * 2_000
    start = time.perf_counter()
    assert len(list(parse_text(lines))) == 2_000
    assert time.perf_counter() - start < 2.0  # ~0.05 s here; generous for slow CI


# --- properties ------------------------------------------------------------------------------------

VALID = [
    FULL,
    "NVRM: Xid (PCI:0018:01:00): 13, pid='<unknown>', name=nvc:[driver], Graphics Exception",
    "NVRM: Xid (0000:01:00): 8, Channel 0000000a",
    "NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
    "NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000)",
    "NVRM: GPU at PCI:0000:9b:00: " + UUID,
    SINGLE,
    *MULTI,
]
PROP = settings(max_examples=200, deadline=None)


@PROP
@given(st.text())
def test_arbitrary_text_never_raises(text: str) -> None:
    for rec in XidParser().feed(text):
        assert isinstance(rec, XidRecord)


@PROP
@given(
    st.lists(st.one_of(st.text(), st.sampled_from(VALID), st.sampled_from(PREFIXES).map(lambda p: p + FULL)))
)
def test_arbitrary_lines_never_raise(lines: list[str]) -> None:
    for rec in parse_text(lines):
        assert rec.pci_bus_id.count(":") == 2
        assert rec.xid >= 0


@st.composite
def mutated(draw: st.DrawFn) -> str:
    line = draw(st.sampled_from(PREFIXES)) + draw(st.sampled_from(VALID))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(line)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "truncate"]))
        chars = draw(st.text(min_size=1, max_size=5))
        if op == "insert":
            line = line[:pos] + chars + line[pos:]
        elif op == "delete":
            line = line[:pos] + line[pos + len(chars) :]
        elif op == "replace":
            line = line[:pos] + chars + line[pos + len(chars) :]
        else:
            line = line[:pos]
    return line


@PROP
@given(st.lists(mutated(), min_size=1, max_size=10))
def test_mutated_lines_parse_or_are_ignored(lines: list[str]) -> None:
    for rec in parse_text(lines):
        assert rec.raw.startswith("NVRM:")


_NAME = st.from_regex(
    r"[A-Za-z0-9_.:\[\]/-]([A-Za-z0-9_.:\[\] /-]{0,20}[A-Za-z0-9_.:\[\]/-])?", fullmatch=True
)
_MESSAGE = st.from_regex(r"[A-Z][A-Za-z0-9 ,.:()_=-]{0,60}", fullmatch=True).map(str.strip)


@PROP
@given(
    domain=st.integers(0, 0xFFFF),
    bus=st.integers(0, 0xFF),
    dev=st.integers(0, 0x1F),
    xid=st.integers(1, 200),
    pid=st.one_of(st.none(), st.integers(0, 4_194_304)),
    name=st.one_of(st.none(), _NAME),
    message=_MESSAGE,
    prefix=st.sampled_from(PREFIXES),
    pci_prefix=st.booleans(),
)
def test_generated_lines_round_trip(
    domain: int,
    bus: int,
    dev: int,
    xid: int,
    pid: int | None,
    name: str | None,
    message: str,
    prefix: str,
    pci_prefix: bool,
) -> None:
    parts = [f"NVRM: Xid ({'PCI:' if pci_prefix else ''}{domain:04x}:{bus:02x}:{dev:02x}): {xid}"]
    parts.append(f"pid={pid}" if pid is not None else "pid='<unknown>'")
    if name is not None:
        parts.append(f"name={name}")
    parts.append(message)
    line = ", ".join(parts)
    [rec] = XidParser().feed(prefix + line)
    assert rec.xid == xid
    assert rec.pci_bus_id == f"{domain:04x}:{bus:02x}:{dev:02x}.0"
    assert rec.pid == pid
    assert rec.process == name
    assert rec.message == message
    assert rec.raw == line
