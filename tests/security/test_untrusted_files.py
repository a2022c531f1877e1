"""Files a user controls, opened by a root daemon (watchd.untrusted): each hostile case refused without
blocking, opening a device or reading past the limit."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from watchd.untrusted import Refused, open_untrusted, read_bounded

NOBODY = 65534


def _refused(path: Path, owners: set[int] | None = None) -> str:
    with pytest.raises(Refused) as info:
        fd = open_untrusted(path, owners=owners)
        os.close(fd)
    return info.value.reason


def test_a_regular_file_is_read(tmp_path: Path) -> None:
    f = tmp_path / "out"
    f.write_bytes(b"NCCL WARN hello\n")
    fd = open_untrusted(f, owners={os.geteuid()})
    try:
        assert read_bounded(fd, 100, f) == b"NCCL WARN hello\n"
    finally:
        os.close(fd)


def test_a_symlink_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    link = tmp_path / "out"
    link.symlink_to(secret)
    assert _refused(link) == "symlink"
    dev = tmp_path / "zero"
    dev.symlink_to("/dev/zero")
    assert _refused(dev) == "symlink"


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    assert _refused(fifo) == "not_regular"  # a plain open() would wait for a writer forever


def test_devices_sockets_and_folders_are_refused_unopened(tmp_path: Path) -> None:
    for device in ("/dev/zero", "/dev/urandom", "/dev/null"):
        assert _refused(Path(device)) == "not_regular"
    sock_path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        assert _refused(sock_path) == "not_regular"
    assert _refused(tmp_path) == "not_regular"


def test_a_file_of_another_owner_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "out"
    f.write_text("x\n")
    assert _refused(f, owners={NOBODY}) == "owner"  # root's file, the job's user is nobody


def test_a_link_higher_up_the_path_leads_nowhere_the_user_could_not_read(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "shadow").write_text("NCCL WARN secret\n")
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "dir").symlink_to(private)  # the job's folder swapped for a link
    assert _refused(tmp_path / "user" / "dir" / "shadow", owners={NOBODY}) == "owner"


def test_missing_is_its_own_reason(tmp_path: Path) -> None:
    assert _refused(tmp_path / "nothing") == "missing"


def test_a_file_grown_past_the_limit_is_refused_not_read_whole(tmp_path: Path) -> None:
    f = tmp_path / "dump"
    with open(f, "wb") as fh:
        fh.truncate(50 << 30)  # 50 GiB sparse: its size says nothing about what reading it costs
    fd = open_untrusted(f)
    try:
        with pytest.raises(Refused) as info:
            read_bounded(fd, 1 << 20, f)
        assert info.value.reason == "too_large"
    finally:
        os.close(fd)
