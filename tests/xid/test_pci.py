from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchd.xid.pci import normalize_pci


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PCI:0000:9b:00", "0000:9b:00.0"),  # kernel Xid line
        ("0000:9b:00", "0000:9b:00.0"),  # older driver, no PCI: prefix
        ("00000000:9B:00.0", "0000:9b:00.0"),  # NVML busId
        ("0000:5d:00.0", "0000:5d:00.0"),  # sysfs / "GPU 0000:5d:00.0: ..." form
        ("PCI:0009:01:00", "0009:01:00.0"),  # non-zero domains (GB200)
        ("0018:01:00.0", "0018:01:00.0"),
        ("00000018:01:00.0", "0018:01:00.0"),
        ("pci:0000:3B:00.1", "0000:3b:00.1"),  # prefix in any case, function kept
        ("  0000:b3:00.0\n", "0000:b3:00.0"),  # surrounding whitespace
        ("9b:00.0", "0000:9b:00.0"),  # no domain
        ("18:00", "0000:18:00.0"),
        ("10000:00:1f.7", "10000:00:1f.7"),  # VMD domain keeps its digits
        ("0000:00:1e", "0000:00:1e.0"),
    ],
)
def test_normalizes(text: str, expected: str) -> None:
    assert normalize_pci(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "PCI:",
        "garbage",
        "0000:9b",  # no device
        "0000:9b:00.8",  # function is 0-7
        "0000:9b:20.0",  # device is 0-1f
        "000:9b:00.0",  # domain too short
        "000000000:9b:00.0",  # domain too long
        "0000:9bb:00.0",
        "0000:9b:00.0.0",
        "0000:9b:00.",
        "GPU-12345678-abcd",
        "0000:9b:00.0 trailing",
        "\uff10000:9b:00.0",  # full-width digit
    ],
)
def test_garbage_is_none(text: str) -> None:
    assert normalize_pci(text) is None


def test_kernel_and_nvml_forms_join() -> None:
    assert normalize_pci("PCI:0000:9b:00") == normalize_pci("00000000:9B:00.0")


@settings(max_examples=200)
@given(
    domain=st.integers(0, 0xFFFF),
    bus=st.integers(0, 0xFF),
    dev=st.integers(0, 0x1F),
    fn=st.integers(0, 7),
    upper=st.booleans(),
    nvml=st.booleans(),
)
def test_roundtrip(domain: int, bus: int, dev: int, fn: int, upper: bool, nvml: bool) -> None:
    text = f"{domain:08x}:{bus:02x}:{dev:02x}.{fn}" if nvml else f"PCI:{domain:04x}:{bus:02x}:{dev:02x}.{fn}"
    if upper:
        text = text.upper()
    canonical = f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"
    assert normalize_pci(text) == canonical
    assert normalize_pci(canonical) == canonical  # idempotent


@settings(max_examples=200)
@given(st.text())
def test_never_raises(text: str) -> None:
    result = normalize_pci(text)
    assert result is None or normalize_pci(result) == result
