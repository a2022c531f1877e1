"""What a secret file may be (docs/security.md, *Secret files*), in the spirit of OpenSSH's StrictModes
(``safe_path``): the file owned by the daemon's user or root, a regular file nobody else may write, and
every directory on the way to it (each link followed, and the directories of its target too) owned by the
daemon's user or root and writable by nobody else, but for a sticky directory (``/tmp``) where the entry
itself, file or link, is ours or root's. Each refusal names the config key and the file. The tests chown to
``nobody`` (65534): they need root, which they are where they run (the CI container)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import structlog

from watchd.credentials import NamedToken, TokenSource, check_secret_file
from watchd.errors import ConfigError

NOBODY = 65534
SECRET = "s3cret-token"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def secret(folder: Path, name: str = "token", mode: int = 0o600) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(SECRET + "\n")
    path.chmod(mode)
    return path


def refused(path: Path, *words: str, key: str = "auth") -> str:
    with pytest.raises(ConfigError) as info:
        TokenSource(token_file=path).resolve(key)
    message = str(info.value)
    assert f"{key}.token_file" in message and str(path) in message, message
    for word in words:
        assert word in message, message
    return message


def test_a_private_file_of_ours_is_accepted(tmp_path: Path) -> None:
    assert TokenSource(token_file=secret(tmp_path / "etc")).resolve() == SECRET


def test_group_or_world_writable_files_are_refused(tmp_path: Path) -> None:
    path = secret(tmp_path / "etc", mode=0o666)
    refused(path, "writable by others", "0666")
    path.chmod(0o620)
    refused(path, "writable by its group", "0620")


def test_a_world_readable_file_is_accepted_with_a_warning(tmp_path: Path) -> None:
    path = secret(tmp_path / "etc", mode=0o644)
    with structlog.testing.capture_logs() as logs:
        assert TokenSource(token_file=path).resolve() == SECRET
    assert [entry["event"] for entry in logs] == ["secret_file_world_readable"], logs


@needs_root
def test_a_private_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """Was accepted: mode 0600 alone said nothing of whose it is, and its owner can swap the secret."""
    path = secret(tmp_path / "etc")
    os.chown(path, NOBODY, NOBODY)
    refused(path, "owned by uid 65534")


@needs_root
def test_a_root_file_in_a_world_writable_directory_is_refused(tmp_path: Path) -> None:
    """Was accepted: whoever can write the directory can replace the file by their own."""
    folder = tmp_path / "open"
    path = secret(folder)
    folder.chmod(0o777)
    refused(path, str(folder), "writable by others", "0777")
    folder.chmod(0o770)
    refused(path, str(folder), "writable by its group")


@needs_root
def test_a_directory_above_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = secret(tmp_path / "theirs" / "etc")
    os.chown(tmp_path / "theirs", NOBODY, NOBODY)
    refused(path, str(tmp_path / "theirs"), "owned by uid 65534")


@needs_root
def test_a_sticky_directory_admits_our_own_entries_only(tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    path = secret(sticky)
    sticky.chmod(0o1777)
    assert TokenSource(token_file=path).resolve() == SECRET  # ours, in /tmp-like: nobody can replace it
    below = secret(sticky / "mine")  # a directory of ours in it, and the file in that
    assert TokenSource(token_file=below).resolve() == SECRET
    os.chown(sticky / "mine", NOBODY, NOBODY)
    refused(below, "owned by uid 65534", str(sticky))


@needs_root
def test_a_link_of_another_user_in_a_sticky_directory_is_refused(tmp_path: Path) -> None:
    """Was accepted: a link in /tmp that another user made (or can swap) pointing at a file of ours."""
    target = secret(tmp_path / "etc")
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    link = sticky / "token"
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)
    refused(link, "link", "owned by uid 65534", str(sticky))


@needs_root
def test_a_link_through_an_open_directory_is_refused(tmp_path: Path) -> None:
    """The link is in a safe place, but its target is in a directory anyone can write: each step counts."""
    open_dir = tmp_path / "open"
    target = secret(open_dir)
    open_dir.chmod(0o777)
    link = tmp_path / "etc" / "token"
    link.parent.mkdir()
    link.symlink_to(target)
    refused(link, str(open_dir), "writable by others")
    # a link in a world-writable directory that is not sticky: anyone can replace the link itself
    hop = open_dir / "hop"
    hop.symlink_to(secret(tmp_path / "safe"))
    refused(hop, str(open_dir), "writable by others")


def test_a_kubernetes_secret_volume_is_accepted(tmp_path: Path) -> None:
    """The layout the kubelet writes: a sticky world-writable tmpfs (1777), ``token -> ..data/token``,
    ``..data -> ..2026_12_05...``, links and directory owned by root (us, here): nobody else can change
    any of it."""
    volume = tmp_path / "secret"
    secret(volume / "..2026_12_05_10_00_00.123", mode=0o400)
    (volume / "..data").symlink_to("..2026_12_05_10_00_00.123")
    (volume / "token").symlink_to("..data/token")
    volume.chmod(0o1777)
    assert TokenSource(token_file=volume / "token").resolve() == SECRET


def test_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    refused(fifo, "not a regular file")
    (tmp_path / "dir").mkdir(mode=0o700)
    refused(tmp_path / "dir", "not a regular file")


def test_a_link_loop_is_refused_not_followed_for_ever(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    refused(tmp_path / "a", "links")


def test_a_relative_path_and_dot_dot_are_checked_as_the_kernel_resolves_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret(tmp_path / "etc")
    (tmp_path / "etc" / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    assert TokenSource(token_file=Path("etc/sub/../token")).resolve() == SECRET


def test_a_missing_file_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    message = refused(tmp_path / "none", "cannot read", key="heartbeat.token_secret")
    assert "No such file" in message


def test_the_key_names_which_credential(tmp_path: Path) -> None:
    from watchd.credentials import EngineAuth
    from watchd.security import engine_credentials

    bad = secret(tmp_path / "etc", "alice", mode=0o666)
    auth = EngineAuth(token="agents", operators=[NamedToken(name="alice", token_file=bad)])
    with pytest.raises(
        ConfigError, match=r"auth\.operators\[0\] \(alice\)\.token_file: .*writable by others"
    ):
        engine_credentials(auth)


def test_systemd_credentials_keep_working(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``LoadCredential=token:/etc/watchd/token``: systemd's copy (0400, in a private directory) is read in
    place of the configured file, which the service's user need not even reach; a problem with the copy
    names both."""
    credentials = tmp_path / "run" / "credentials" / "watchd-engine.service"
    copy = secret(credentials, "token", mode=0o400)
    credentials.chmod(0o500)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    configured = tmp_path / "etc" / "watchd" / "token"  # not even there: systemd's copy is what is read
    assert TokenSource(token_file=configured).resolve() == SECRET
    copy.chmod(0o666)
    with pytest.raises(ConfigError) as info:
        TokenSource(token_file=configured).resolve()
    assert str(copy) in str(info.value) and str(configured) in str(info.value), info.value


def test_check_secret_file_names_the_key_it_is_given(tmp_path: Path) -> None:
    path = secret(tmp_path / "etc", mode=0o606)
    with pytest.raises(ConfigError, match=r"^state\.postgres\.password_file: "):
        check_secret_file(path, "state.postgres.password_file")
    assert stat.S_IMODE(path.stat().st_mode) == 0o606  # only looked at


def test_the_postgres_password_and_dsn_files_are_secret_files(tmp_path: Path) -> None:
    from watchd.store.settings import PostgresConfig

    password = secret(tmp_path / "etc", "pg-password", mode=0o660)
    config = PostgresConfig(dsn="host=db dbname=watchd", password_file=password)
    with pytest.raises(ConfigError, match=r"state\.postgres\.password_file: .*writable by its group"):
        config.resolve()
    password.chmod(0o600)
    assert config.resolve() == ("host=db dbname=watchd", SECRET)
