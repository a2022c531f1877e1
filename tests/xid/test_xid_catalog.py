from __future__ import annotations

import dataclasses

import pytest

from watchd.xid.catalog import BUCKETS, RECOVERY_ACTIONS, XidInfo, known_xids, lookup

EXPECTED_BUCKETS = {
    8: "RESTART_APP",
    13: "RESTART_APP",
    31: "RESTART_APP",
    32: "RESTART_APP",
    38: "IGNORE",
    43: "IGNORE",  # the catalog: the application faulted, the GPU stays healthy
    44: "IGNORE",
    45: "WORKFLOW_XID_45",
    48: "WORKFLOW_XID_48",
    56: "CONTACT_SUPPORT",
    57: "CONTACT_SUPPORT",
    61: "CONTACT_SUPPORT",
    62: "RESET_GPU",
    63: "IGNORE",
    64: "RESET_GPU",
    65: "CONTACT_SUPPORT",
    68: "RESTART_APP",
    69: "RESTART_APP",
    74: "WORKFLOW_NVLINK_ERR",
    79: "RESTART_BM",
    92: "IGNORE",
    94: "RESTART_APP",
    95: "RESET_GPU",
    109: "RESET_GPU",
    110: "RESET_GPU",
    119: "RESET_GPU",
    120: "RESET_GPU",
    121: "IGNORE",
    136: "RESET_GPU",
    140: "RESET_GPU",
    143: "RESET_GPU",
    **{x: "WORKFLOW_NVLINK5_ERR" for x in range(144, 151)},
    154: "XID_154",
    155: "RESET_GPU",
    156: "RESET_GPU",
    158: "RESET_GPU",
    # the catalog's "Unused" Xids, its NVENC3 and DLA ones
    1: "CONTACT_SUPPORT",
    9: "CONTACT_SUPPORT",
    24: "CONTACT_SUPPORT",
    73: "CONTACT_SUPPORT",
    118: "CONTACT_SUPPORT",
    138: "CONTACT_SUPPORT",
    142: "CONTACT_SUPPORT",
    152: "IGNORE",
    153: "IGNORE",
    # the catalog names 162-172 without a bucket, 173 comes later: watchd's choices (docs/rules.md)
    **{x: "IGNORE" for x in range(162, 166)},  # power smoothing
    166: "CONTACT_SUPPORT",  # confidential computing
    167: "RESTART_BM",  # PCIe fatal timeout
    168: "RESTART_BM",  # errors in the write-protected region: boot again
    169: "RESET_GPU",  # micro-controller halt, as Xid 62
    170: "CONTACT_SUPPORT",  # confidential computing
    171: "WORKFLOW_XID_48",  # the DRAM detail of an Xid 48
    172: "WORKFLOW_XID_48",  # the SRAM detail of an Xid 48
    173: "RESTART_BM",  # C2C fatal link failure
}


@pytest.mark.parametrize(("xid", "bucket"), sorted(EXPECTED_BUCKETS.items()))
def test_bucket(xid: int, bucket: str) -> None:
    info = lookup(xid)
    assert info.xid == xid
    assert info.bucket == bucket
    assert info.meaning and info.meaning != "unknown Xid"
    assert info.action


@pytest.mark.parametrize(
    ("xid", "words"),
    [
        (79, "GPU has fallen off the bus"),
        (48, "double-bit ECC error"),
        (13, "graphics engine exception"),
        (31, "GPU memory page fault"),
        (43, "GPU stopped processing"),
        (63, "row remapping"),
        (64, "row remapping"),
        (74, "NVLink error"),
        (92, "high single-bit ECC error rate"),
        (94, "contained ECC error"),
        (95, "uncontained ECC error"),
        (119, "GSP"),
        (120, "GSP"),
        (140, "unrecovered ECC error"),
        (154, "GPU recovery action changed"),
        (1, "unused"),
        (163, "power smoothing"),
        (166, "confidential-computing"),
        (167, "PCIe fatal timeout"),
        (168, "write-protected region"),
        (169, "micro-controller halt"),
        (171, "DRAM"),
        (172, "SRAM"),
        (173, "C2C fatal link failure"),
    ],
)
def test_meaning(xid: int, words: str) -> None:
    assert words.lower() in lookup(xid).meaning.lower()


@pytest.mark.parametrize(
    ("xid", "words"),
    [
        (79, "drain node and reboot"),
        (13, "restart the application"),
        (63, "none; informational"),
        (92, "none; informational"),
        (95, "reset the GPU"),
        (119, "reset the GPU"),
        (45, "fabric manager"),
        (163, "no GPU reset required"),
        (167, "drain node and reboot"),
        (172, "SRAM DBE threshold"),
        (173, "drain node and reboot"),
    ],
)
def test_action(xid: int, words: str) -> None:
    assert words in lookup(xid).action


def test_every_number_of_the_catalog_through_173_is_known() -> None:
    assert set(range(1, 174)) <= known_xids()


@pytest.mark.parametrize("xid", [0, -1, 174, 999, 10**9])
def test_unknown(xid: int) -> None:
    assert lookup(xid) == XidInfo(xid, "unknown Xid", "UNKNOWN", "consult the NVIDIA Xid catalog")


def test_every_entry_is_complete() -> None:
    assert set(EXPECTED_BUCKETS) <= known_xids()
    for xid in known_xids():
        info = lookup(xid)
        assert info.bucket in BUCKETS
        assert info.bucket != "UNKNOWN"
        assert info.meaning.strip() == info.meaning and info.meaning
        assert info.action.strip() == info.action and info.action


def test_info_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        lookup(79).bucket = "IGNORE"  # type: ignore[misc]


def test_recovery_actions() -> None:
    assert RECOVERY_ACTIONS == {
        0: "NONE",
        1: "GPU_RESET",
        2: "NODE_REBOOT",
        3: "DRAIN_P2P",
        4: "DRAIN_AND_RESET",
        5: "RECOVER_IMEX_DOMAIN",
        6: "BUS_RESET",
        7: "SYSTEM_REBOOT",
    }


def test_reexported() -> None:
    import watchd.xid as xid

    assert xid.lookup is lookup
    assert xid.XidInfo is XidInfo
